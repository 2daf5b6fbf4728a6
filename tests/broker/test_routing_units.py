"""Topic trie, headers matching, exchange indexes and vhost routing (pure units)."""

from __future__ import annotations

import datetime

from hypothesis import given
from hypothesis import strategies as st

from node.broker.exchanges import Binding, Dest, Exchange
from node.broker.headers_match import headers_match
from node.broker.topic_trie import TopicTrie
from node.broker.vhost import VHost


def _words(key: str) -> list[str]:
    """RabbitMQ's view of a topic key: "" is zero words, "a." is ["a", ""]."""
    return key.split(".") if key else []


def _word_match(pat: list[str], words: list[str]) -> bool:
    if not pat:
        return not words
    head, rest = pat[0], pat[1:]
    if head == "#":
        return any(_word_match(rest, words[i:]) for i in range(len(words) + 1))
    if not words:
        return False
    return (head == "*" or head == words[0]) and _word_match(rest, words[1:])


def test_topic_examples() -> None:
    trie: TopicTrie[str] = TopicTrie()
    for pattern in ["a.*.c", "a.#", "#", "*.b.*", "a.b.c", "#.c", "a.#.c"]:
        trie.add(pattern, pattern)
    assert trie.match("a.b.c") == {"a.*.c", "a.#", "#", "*.b.*", "a.b.c", "#.c", "a.#.c"}
    assert trie.match("a") == {"a.#", "#"}
    assert trie.match("x.b.y") == {"#", "*.b.*"}
    assert trie.match("a.c") == {"a.#", "#", "#.c", "a.#.c"}
    assert trie.match("") == {"#"}


def test_topic_empty_routing_key_is_zero_words() -> None:
    trie: TopicTrie[str] = TopicTrie()
    for pattern in ["*", "#", "#.#", "", "*.#", "#.*", "a.*", "*.*"]:
        trie.add(pattern, pattern)
    assert trie.match("") == {"#", "#.#", ""}
    assert trie.match("x") == {"*", "#", "#.#", "*.#", "#.*"}
    assert trie.match(".") == {"#", "#.#", "*.#", "#.*", "*.*"}
    assert trie.match("a.") == {"#", "#.#", "*.#", "#.*", "a.*", "*.*"}
    trie.remove("", "")
    assert trie.match("") == {"#", "#.#"}


def test_topic_remove_counts_and_prunes() -> None:
    trie: TopicTrie[str] = TopicTrie()
    trie.add("a.b", "q")
    trie.add("a.b", "q")
    trie.remove("a.b", "q")
    assert trie.match("a.b") == {"q"}
    trie.remove("a.b", "q")
    assert trie.match("a.b") == set()
    assert trie.is_empty()


_word = st.sampled_from(["a", "b", "c", ""])
_pat_word = st.sampled_from(["a", "b", "*", "#"])


@given(st.lists(st.lists(_pat_word, min_size=0, max_size=4), min_size=1, max_size=5),
       st.lists(_word, min_size=0, max_size=5))
def test_topic_matches_naive_reference(patterns: list[list[str]], key_words: list[str]) -> None:
    trie: TopicTrie[str] = TopicTrie()
    for words in patterns:
        trie.add(".".join(words), ".".join(words))
    key = ".".join(key_words)
    expected = {".".join(p) for p in patterns if _word_match(_words(".".join(p)), _words(key))}
    assert trie.match(key) == expected


def test_headers_all_any_and_x_variants() -> None:
    headers = {"a": 1, "b": "two", "x-c": 3}
    assert headers_match({"x-match": "all", "a": 1, "b": "two"}, headers)
    assert not headers_match({"x-match": "all", "a": 1, "b": "three"}, headers)
    assert headers_match({"x-match": "any", "a": 2, "b": "two"}, headers)
    assert not headers_match({"x-match": "any", "a": 2}, headers)
    assert headers_match({"a": 1, "x-c": 4}, headers)  # x- keys ignored by default (all)
    assert not headers_match({"x-match": "all-with-x", "a": 1, "x-c": 4}, headers)
    assert headers_match({"x-match": "any-with-x", "x-c": 3}, headers)
    assert headers_match({"x-match": "all"}, headers)
    assert not headers_match({"x-match": "any"}, headers)


def test_headers_void_matches_presence_and_types_compare_by_class() -> None:
    assert headers_match({"a": None}, {"a": "anything"})
    assert not headers_match({"a": None}, {"b": 1})
    assert not headers_match({"a": 1}, {"a": "1"})
    assert not headers_match({"a": True}, {"a": 1})
    assert headers_match({"a": b"bytes"}, {"a": "bytes"})
    when = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    assert headers_match({"a": when}, {"a": when})
    assert not headers_match({"a": 1}, None)


def _vhost_with(*queues: str) -> VHost[object]:
    vhost: VHost[object] = VHost.create("/")
    for q in queues:
        vhost.queues[q] = object()
    return vhost


def test_exchange_to_exchange_cycle_routes_each_queue_once() -> None:
    vhost = _vhost_with("q1", "q2")
    vhost.exchanges["e1"] = Exchange("e1", "fanout")
    vhost.exchanges["e2"] = Exchange("e2", "fanout")
    vhost.add_binding(Binding("e1", Dest("exchange", "e2"), "", {}))
    vhost.add_binding(Binding("e2", Dest("exchange", "e1"), "", {}))
    vhost.add_binding(Binding("e1", Dest("queue", "q1"), "", {}))
    vhost.add_binding(Binding("e2", Dest("queue", "q1"), "", {}))
    vhost.add_binding(Binding("e2", Dest("queue", "q2"), "", {}))
    assert sorted(vhost.route("e1", "k", None)) == ["q1", "q2"]


def test_alternate_exchange_only_when_nothing_routed() -> None:
    vhost = _vhost_with("main", "unrouted")
    vhost.exchanges["ae"] = Exchange("ae", "fanout")
    vhost.exchanges["x"] = Exchange("x", "direct", arguments={"alternate-exchange": "ae"})
    vhost.add_binding(Binding("x", Dest("queue", "main"), "k", {}))
    vhost.add_binding(Binding("ae", Dest("queue", "unrouted"), "", {}))
    assert vhost.route("x", "k", None) == ("main",)
    assert vhost.route("x", "other", None) == ("unrouted",)


def test_route_cache_invalidated_on_binding_change() -> None:
    vhost = _vhost_with("q")
    vhost.exchanges["x"] = Exchange("x", "direct")
    assert vhost.route("x", "k", None) == ()
    binding = Binding("x", Dest("queue", "q"), "k", {})
    vhost.add_binding(binding)
    assert vhost.route("x", "k", None) == ("q",)
    vhost.remove_binding(binding)
    assert vhost.route("x", "k", None) == ()


def test_default_exchange_routes_by_queue_name() -> None:
    vhost = _vhost_with("q")
    assert vhost.route("", "q", None) == ("q",)
    assert vhost.route("", "nope", None) == ()


def test_headers_exchange_routes_by_headers_not_cached() -> None:
    vhost = _vhost_with("q")
    vhost.add_binding(Binding("amq.headers", Dest("queue", "q"), "", {"x-match": "any", "k": "v"}))
    assert vhost.route("amq.headers", "", {"k": "v"}) == ("q",)
    assert vhost.route("amq.headers", "", {"k": "w"}) == ()


def test_federation_upstream_exchange_results_are_not_cached() -> None:
    """An x-federation-upstream exchange routes by the message's x-received-from header: a message its hop check
    stops must not leave a cached empty route that drops the next, fresh message with the same key."""
    vhost = _vhost_with("q")
    vhost.exchanges["up"] = Exchange("up", "x-federation-upstream",
                                     arguments={"x-max-hops": 1, "x-downstream-name": "down"})
    vhost.add_binding(Binding("up", Dest("queue", "q"), "", {}))
    seen = {"x-received-from": [{"uri": "amqp://down", "exchange": "x", "redelivered": False, "cluster-name": "down"}]}
    assert vhost.route("up", "k", seen) == ()
    assert vhost.route("up", "k", {}) == ("q",)
    assert vhost.route("up", "k", None) == ("q",)
