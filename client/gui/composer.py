"""The composer: one line of text sent as a new Turn of the open session. The text stays in
the box until the daemon accepts the Turn (`sent`): a refused send keeps what was typed."""

from __future__ import annotations

from textual.message import Message
from textual.widgets import Input


class Composer(Input):
    class Send(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(placeholder="Message the agent… (Enter sends)", id=id)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        text = event.value.strip()
        if text:
            self.post_message(self.Send(text))

    def sent(self, text: str) -> None:
        """The Turn with `text` was accepted: clear the box, unless the user typed on."""
        if self.value.strip() == text:
            self.value = ""
