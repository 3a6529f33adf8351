"""Which nights rebuild the user state from the whole log, and why (`user_state._rebuild_reason`)."""

from __future__ import annotations

import datetime

from lumos.core.lineage import LineageInput
from lumos.core.tables import TableRef
from lumos.data.event_files import EventFile
from lumos.data.user_state import StateKey, StateVersion, _rebuild_reason, _unconfirmed

KEY = StateKey("sha256:recipe", "quickstart.vocab@0", "/data/events", 21)
DAY = datetime.date(2026, 9, 13)
FILES = {"/data/events/part-0.parquet": "100:1", "/data/events/part-1.parquet": "90:2"}
EVENTS = LineageInput("files", "/data/events", "sha256:before")


def state(**changes) -> StateVersion:
    recorded = {uri: EventFile(identity, "sha256:x", first_event=0, last_event=0) for uri, identity in FILES.items()}
    fields = {"ref": TableRef("quickstart", "user_state", 3), "as_of": DAY, "key": KEY, "events": EVENTS,
              "files": recorded} | changes
    return StateVersion(**fields)


def reason(previous, as_of=DAY, events=EVENTS, files=FILES, key=KEY):
    return _rebuild_reason(previous, key, as_of, events, files)


def test_an_unchanged_source_or_one_with_new_files_is_carried_forward():
    assert reason(state()) is None
    assert reason(state(), as_of=DAY + datetime.timedelta(days=2)) is None
    grown = FILES | {"/data/events/part-2.parquet": "10:3"}
    assert reason(state(), events=LineageInput("files", "/data/events", "sha256:after"), files=grown) is None


def test_what_rebuilds_says_why():
    assert "first run" in reason(None)
    assert "named by no predictions commit" in reason(_unconfirmed(TableRef("quickstart", "user_state", 4)))
    assert "recipe" in reason(state(key=StateKey("sha256:other", KEY.vocab, KEY.events, 21)))
    assert "vocabulary" in reason(state(key=StateKey(KEY.recipe_hash, "quickstart.vocab@1", KEY.events, 21)))
    assert "events source /data/events differs" in reason(state(key=StateKey(KEY.recipe_hash, KEY.vocab, "/old", 21)))
    assert "before the state's date" in reason(state(), as_of=DAY - datetime.timedelta(days=1))
    changed = LineageInput("files", "/data/events", "sha256:after")
    rewritten = {"/data/events/part-0.parquet": "120:5", "/data/events/part-1.parquet": "90:2"}
    assert "rewritten, not appended (1 files" in reason(state(), events=changed, files=rewritten)
    assert "rewritten" in reason(state(), events=changed, files={"/data/events/part-1.parquet": "90:2"})
    assert "not a folder of files" in reason(state(files=None), events=LineageInput("delta", "x", 4), files=None)
    assert "older lumos" in reason(state(files=None))  # a listing recorded without per-file records
