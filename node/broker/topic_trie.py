"""Topic-exchange binding trie (pure).

Binding keys are split on "." into words; each trie edge is one word, with "*" matching exactly one routing-key word
and "#" matching zero or more. As in RabbitMQ, the empty key is zero words (not one empty word): a routing key ""
reaches only bindings that can match nothing ("#", "#.#", ""), while "a." is the two words "a" and "". Each node counts the destinations bound at it (a destination may be bound several
times with different arguments). `match` walks the trie once per routing key, remembering (node, position) pairs
already visited so patterns with several "#" never blow up.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

D = TypeVar("D", bound=Hashable)


class _Node(Generic[D]):
    __slots__ = ("children", "dests")

    def __init__(self) -> None:
        self.children: dict[str, _Node[D]] = {}
        self.dests: dict[D, int] = {}


def split_words(key: str) -> list[str]:
    """rabbit_exchange_type_topic's split: "" is no words; otherwise every "."-separated word, empty ones too."""
    return key.split(".") if key else []


class TopicTrie(Generic[D]):
    def __init__(self) -> None:
        self._root: _Node[D] = _Node()

    def add(self, pattern: str, dest: D) -> None:
        node = self._root
        for word in split_words(pattern):
            nxt = node.children.get(word)
            if nxt is None:
                nxt = node.children[word] = _Node()
            node = nxt
        node.dests[dest] = node.dests.get(dest, 0) + 1

    def remove(self, pattern: str, dest: D) -> None:
        path: list[tuple[_Node[D], str]] = []
        node = self._root
        for word in split_words(pattern):
            nxt = node.children.get(word)
            if nxt is None:
                return
            path.append((node, word))
            node = nxt
        count = node.dests.get(dest, 0)
        if count <= 1:
            node.dests.pop(dest, None)
        else:
            node.dests[dest] = count - 1
        for parent, word in reversed(path):
            child = parent.children[word]
            if child.children or child.dests:
                break
            del parent.children[word]

    def match(self, routing_key: str) -> set[D]:
        words = split_words(routing_key)
        n_words = len(words)
        out: set[D] = set()
        seen: set[tuple[int, int]] = set()
        stack: list[tuple[_Node[D], int]] = [(self._root, 0)]
        while stack:
            node, pos = stack.pop()
            key = (id(node), pos)
            if key in seen:
                continue
            seen.add(key)
            if pos == n_words and node.dests:
                out.update(node.dests)
            hash_child = node.children.get("#")
            if hash_child is not None:
                for skip in range(pos, n_words + 1):
                    stack.append((hash_child, skip))
            if pos < n_words:
                child = node.children.get(words[pos])
                if child is not None:
                    stack.append((child, pos + 1))
                star = node.children.get("*")
                if star is not None:
                    stack.append((star, pos + 1))
        return out

    def is_empty(self) -> bool:
        return not self._root.children and not self._root.dests
