"""The terminal GUI (`agenthost gui`): a Textual app that shows sessions as a fork lineage tree,
a transcript with a Fork action per settled root Turn, and a composer.

All fork state comes from the client Engine (`client.engine`); the widgets keep none of their
own. One concern per module: app (the wiring), view (what the main screen shows),
fork_actions, control_actions, status_text, turn_merge, bridge, session_list, transcript,
composer, controls, resolve.
"""
