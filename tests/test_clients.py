"""The keys file: the old one-key-a-line format, name/team labels, and who a caller is."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.clients import ANONYMOUS, ClientIdentity, caller_of, read_identities
from proxy.settings import read_key_file


def test_old_and_labelled_lines_both_read(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# clients\nsk-old\n\n  sk-alice   name=alice team=search  \nsk-bob team=ops\n")
    assert read_key_file(keys) == {"sk-old", "sk-alice", "sk-bob"}
    assert read_identities(keys) == {
        "sk-old": ClientIdentity(),
        "sk-alice": ClientIdentity("alice", "search"),
        "sk-bob": ClientIdentity(None, "ops"),
    }


@pytest.mark.parametrize(
    "line", ["sk-a name=", "sk-a name=al ice", "sk-a nom=alice", "sk-a name=a/b", "sk-a x"]
)
def test_a_malformed_label_names_the_line(tmp_path: Path, line: str) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"sk-ok\n{line}\n")
    with pytest.raises(ValueError, match=f"{keys}:2"):
        read_identities(keys)


def test_callers_are_labelled_by_name_never_by_key() -> None:
    identities = {"sk-alice": ClientIdentity("alice", "search"), "sk-anon": ClientIdentity()}
    alice = caller_of("sk-alice", identities, keyed=True)
    assert (alice.id, alice.label, alice.identity.team) == ("alice", "alice", "search")
    anon = caller_of("sk-anon", identities, keyed=True)
    assert anon.label == "other" and anon.id.startswith("key-") and "sk-anon" not in anon.id
    assert caller_of("sk-anon", identities, keyed=True).id == anon.id  # stable: its records are its own
    assert ":" not in anon.id  # stores put an identity before a trace id


@pytest.mark.parametrize("token", [None, "", "unused", "sk-anything", "sk-alice"])
def test_without_client_keys_every_bearer_is_the_one_anonymous_client(token: str | None) -> None:
    """The identity rule: no keys configured -> one client, whatever bearer is sent."""
    identities = {"sk-alice": ClientIdentity("alice")}
    assert caller_of(token, identities, keyed=False).id == ANONYMOUS


@pytest.mark.parametrize("name", ["anonymous", "key-0123456789abcdef"])
def test_a_name_the_rule_derives_is_refused(tmp_path: Path, name: str) -> None:
    """A configured name equal to a derived identity would share that client's records."""
    keys = tmp_path / "keys"
    keys.write_text(f"sk-a name={name}\n")
    with pytest.raises(ValueError, match="derives"):
        read_identities(keys)
    keys.write_text("sk-a name=key-0123\nsk-b name=Anonymous2\n")  # neighbours are names like any
    assert len(read_identities(keys)) == 2
