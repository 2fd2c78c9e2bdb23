"""The soaks' Codex Sessions ask (`interaction_chaos`): a Codex Session made with `CODEX_ASKS`
in the soaks' provider environment (the fake Responses API's `soak_responses_reply`) asks for
an approval when a Turn says `/run …`, runs the command only if approved, and its Turn's reply
says which answer it took, as `took` reads it for the `interaction_answered` law."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.interaction_chaos import CODEX_ASKS, RUN, took
from tests.reliability.reliability_harness import provider_env, unwired_reason
from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    settle,
    submit,
    turn_of,
    wait_for,
)
from tests.support.invariants import Answered, check_interaction_answers

CODEX = "codex"

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(unwired_reason(CODEX) is not None, reason=str(unwired_reason(CODEX))),
]


def test_a_soak_codex_session_asks_and_its_turn_says_the_answer_it_took(tmp_path: Path) -> None:
    with provider_env(CODEX, tmp_path / "home") as cwd:
        d = DaemonProcess(tmp_path / "home").start()
        try:
            c = d.client(timeout=120)
            sid = create_session(c, provider=CODEX, cwd=str(cwd), settings=CODEX_ASKS)[
                "agentSessionId"
            ]
            answers: list[Answered] = []
            turns = {}
            for n, decision in enumerate(("approve", "decline")):
                turn_id = submit(c, sid, f"{RUN}echo {n} > asked-{n}.txt")["turnId"]
                asked = wait_for(lambda t=turn_id: turn_of(c, sid, t)["interactions"], 60)
                assert [i["kind"] for i in asked] == ["approval"], asked
                response = {"decision": decision}
                params = {
                    "workspaceId": WS,
                    "agentSessionId": sid,
                    "turnId": turn_id,
                    "requestId": asked[0]["requestId"],
                    "response": response,
                }
                status, body = c.call_raw("interaction.respond", params)
                answers.append(
                    Answered(sid, turn_id, asked[0]["requestId"], response, status, body)
                )
                turns[turn_id] = settle(c, sid, turn_id, timeout=90)
                assert took(turns[turn_id]) == response, turns[turn_id]
                assert (cwd / f"asked-{n}.txt").exists() is (decision == "approve")
        finally:
            d.stop()
    assert [a.status for a in answers] == [200, 200]
    assert check_interaction_answers(answers, turns, took) == []
