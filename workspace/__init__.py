"""Workspace checkpoints: the files of a Session's working directory recorded at a Turn's
start and end in a shadow git object store under the agenthost home (`workspace.shadow`), read
back as changed files and diffs, written out as a new directory, or restored in place, through
an isolated `git` runner (`workspace.git`). Standard library and the `git` program only; it
never writes the person's repository.
"""
