"""Session 41 adversarial pass (outside attacker): the session id a client names in the body
(``_context.session_id``), which becomes part of its context keys and of its pending-write marks'
set (``cogproxy:ctx:{client}:<session>:#writing``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.context.helpers import FIX, REVIEWER, execute, reviewer_answer
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import running_proxy, upstream_policy


@pytest.mark.parametrize("session", ["s41-trailing\n", "s41\r", "s41:x", "s41{x}", "s41 #writing", "é"])
async def test_a_session_id_in_the_body_that_is_no_opaque_name_is_refused(
    fake_upstream: FakeUpstream, tmp_path: Path, session: str
) -> None:
    """Finding (low): ``identity.ID_PATTERN`` ended in ``$``, which also matches before a final
    newline, so ``_context.session_id: "name\\n"`` (headers cannot carry one) was taken: a
    session id with a control character in every context key and mark set of the session, against
    the rule the identity module states (no whitespace or control characters). Expected: 400 like
    any other id that is not an opaque short name, no model asked."""
    fake_upstream.set_default_reply("cheap", reviewer_answer(1, "review"))
    async with running_proxy(tmp_path, upstream_policy(fake_upstream)) as px:
        status, _, envelope = await execute(px.url, REVIEWER, {**FIX, "_context": {"session_id": session}})
    assert status == 400, envelope
    assert "_context.session_id" in envelope["error"]["message"]
    assert fake_upstream.count() == 0
