"""Key patterns: the SCAN glob, the capturing regex, and validation of a group's options."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from exporter.config.settings import from_dict
from exporter.sources.redis_keys.commands import Cycle, GroupReads
from exporter.sources.redis_keys.groups import (
    HashGroup,
    ListGroup,
    SetGroup,
    SeveralTypesGroup,
    StreamGroup,
    ZsetGroup,
    fill,
    key_group,
    key_regex,
    literal,
    placeholders,
    scan_glob,
)

pytestmark = pytest.mark.fast  # no server (scripts/test.sh --fast)


def test_glob_escapes_literal_glob_characters():
    assert scan_glob("orchestrata:queue:{queue}:p{priority}") == "orchestrata:queue:*:p*"
    assert scan_glob("weird[1]*?:{queue}") == "weird\\[1\\]\\*\\?:*"
    assert scan_glob("{queue}\x06\x16{_step}") == "*\x06\x16*"


def test_regex_captures_placeholders():
    match = key_regex("orchestrata:queue:{queue}:p{priority}").match(
        "orchestrata:queue:billing:eu:p3"
    )
    assert match is not None
    assert match.groupdict() == {"queue": "billing:eu", "priority": "3"}
    assert key_regex("{queue}:priority_queue").match("default:processing") is None


def test_fill_builds_keys():
    assert fill("rq:job:{item}", {"item": "abc"}) == "rq:job:abc"


def _group(**overrides):
    return key_group(
        {"system": "s", "pattern": "q:{queue}", "type": "list", "state": "pending", **overrides}
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"pattern": "q:{queue}:{queue}"}, "repeats a placeholder"),
        ({"labels": {"tenant": "x"}}, "'tenant' is not one of"),
        ({"labels": {"queue": "x"}}, "already a pattern placeholder"),
        ({"values": {"priority": ["1"]}}, "not a placeholder of the pattern"),
        ({"stream_group": "g"}, "stream_group applies to stream keys only"),
        ({"oldest": {"time_in": "score"}}, "does not apply to list keys"),
        ({"oldest": {"time_in": "hash", "field": "t"}}, "needs 'hash_key'"),
        ({"oldest": {"time_in": "hash", "field": "t", "hash_key": "job"}}, "must contain {item}"),
        (
            {
                "type": "zset",
                "pattern": "q:{queue}:{priority}",
                "priority_bands": {"width": 10, "names": {1: "low"}},
            },
            "exclude each other",
        ),
    ],
)
def test_invalid_groups(overrides, message):
    with pytest.raises(ValidationError, match=message):
        _group(**overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"type": "set", "oldest": {"time_in": "item"}}, "oldest applies to list, zset, hash"),
        (
            {"type": "hash", "due": {"metric": "queue_scheduled_due"}},
            "due applies to zset keys only",
        ),
        ({"type": "stream", "split_by": {"label": "queue", "field": "q"}}, "not stream"),
        ({"marker": {"key": "m:{item}", "state": "active"}, "type": "set"}, "list and zset keys"),
        ({"type": ["list", "zset"], "stream_group": "g"}, "stream keys only, not list or zset"),
        ({"type": ["list", "zset"], "look_alikes": {"member_key": "{member}"}}, "of one type"),
    ],
)
def test_each_layout_refuses_another_s_options_by_name(overrides, message):
    with pytest.raises(ValidationError, match=message):
        _group(**overrides)


def test_each_type_has_its_layout_and_null_options_are_not_given():
    layouts = {"list": ListGroup, "zset": ZsetGroup, "set": SetGroup, "hash": HashGroup}
    for key_type, layout in {**layouts, "stream": StreamGroup}.items():
        assert type(_group(type=key_type)) is layout
    assert type(_group(type=["list", "zset"])) is SeveralTypesGroup
    assert type(_group(type="set", due=None, oldest=None, by_type={})) is SetGroup
    with pytest.raises(ValidationError, match="a valid dictionary"):
        key_group("q:{queue}")


@pytest.mark.parametrize(
    ("overrides", "read"),
    [
        ({}, None),
        ({"type": "set"}, None),
        ({"type": "zset", "scores": {"window": "due"}, "oldest": {"time_in": "score"}}, None),
        ({"split_by": {"label": "queue", "field": "q"}, "pattern": "q"}, "_split"),
        ({"type": "hash", "split_by": {"label": "queue", "field": "q"}, "pattern": "q"}, "_split"),
        ({"type": "zset", "marker": {"key": "m:{item}", "state": "active"}}, "_marked"),
        ({"type": "zset", "oldest": {"end": "earliest", "time_in": "score"}}, "_earliest"),
        ({"type": "stream", "stream_group": "g"}, "_stream_group"),
    ],
)
def test_each_layout_has_one_read_path(overrides, read):
    group = _group(**overrides)
    found = Cycle.read_of_key(group)
    assert (found and found.func.__name__) == read
    assert GroupReads.suits(group) is (read is None)


def test_a_group_of_several_types_is_read_by_type_not_in_bulk():
    group = _group(type=["list", "zset"], by_type={"zset": {"oldest": {"time_in": "score"}}})
    assert not GroupReads.suits(group)
    assert [type(view) for view in group.views()] == [ListGroup, ZsetGroup]


def test_enumerated_only_when_every_placeholder_is_known():
    assert not _group().enumerated
    assert _group(values={"queue": ["a"]}).enumerated
    assert not _group(pattern="q:{queue}:{_x}", values={"queue": ["a"]}).enumerated


def test_doubled_braces_are_literal_a_hash_tag_in_a_pattern():
    pattern = "{{bull}}:{queue}:wait"
    assert placeholders(pattern) == ["queue"]
    assert scan_glob(pattern) == "{bull}:*:wait"
    match = key_regex(pattern).match("{bull}:emails:wait")
    assert match is not None and match.groupdict() == {"queue": "emails"}
    assert key_regex(pattern).match("bull:emails:wait") is None
    assert fill("{{bull}}:{queue}:{item}", {"queue": "emails", "item": "7"}) == "{bull}:emails:7"
    assert literal("{bull}") == "{{bull}}" and placeholders(literal("{a}:{b}")) == []
    _group(pattern=pattern)  # {bull} is no placeholder to refuse
    with pytest.raises(ValidationError, match=r"placeholder \{bull\} is not a label"):
        _group(pattern="{bull}:{queue}:wait")


def test_the_bullmq_preset_takes_a_hash_tagged_prefix():
    config = from_dict({"presets": [{"name": "bullmq", "params": {"prefix": "{bull}"}}]})
    group = config.sources.redis.key_groups[0]
    assert group.pattern == "{{bull}}:{queue}:wait"
    assert group.values_from_keys["queue"] == "{{bull}}:{value}:meta"
    assert group.oldest.hash_key == "{{bull}}:{queue}:{item}"
    assert config.sources.native.bullmq.prefix == "{bull}"  # a key prefix, not a pattern
    assert from_dict({"presets": ["bullmq"]}).sources.redis.key_groups[0].pattern == (
        "bull:{queue}:wait"
    )
