"""The terminal GUI (`agenthost gui`): a Textual app that shows sessions as a fork lineage tree,
a transcript with a Fork action per settled root Turn, and a composer.

All fork state comes from the client Engine (`client.engine`); the widgets keep none of their
own. One concern per module: bridge, session list, transcript, composer, app.
"""
