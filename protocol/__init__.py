"""The wire protocol as types, for the daemon and its clients alike: every method's name,
params, result and the error reasons it may answer, in one table (`protocol.methods`), the
objects they carry (`protocol.objects`) and the events (`protocol.events`). Standard library
only; docs/protocol.md is the prose of the same contract, and a test keeps the two equal.
"""
