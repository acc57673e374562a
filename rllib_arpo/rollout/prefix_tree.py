"""The radix tree (compressed trie) of one ``generate`` call's prefixes, from which the HF
engine (``rollout.hf_engine``) prefills every shared span once: a node is a span of tokens, and
its path from the root is a prefix that some of the call's prefixes share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass(eq=False)
class PrefixNode:
    """A span of a radix tree of token prefixes: its path from the root is a shared prefix."""

    tokens: list[int]
    parent: PrefixNode | None
    children: dict[int, PrefixNode] = field(default_factory=dict)  # keyed by first token
    is_prefix_end: bool = False  # some prefix of the call ends exactly here

    @property
    def start(self) -> int:
        """Position id of the span's first token (length of the path above it)."""
        node, length = self.parent, 0
        while node is not None:
            length += len(node.tokens)
            node = node.parent
        return length


def _common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    mismatch = (torch.as_tensor(a[:n]) != torch.as_tensor(b[:n])).nonzero()
    return int(mismatch[0]) if len(mismatch) else n


def insert_prefix(root: PrefixNode, prefix: Sequence[int]) -> PrefixNode:
    """Add ``prefix`` to the radix tree under ``root``; return the node where it ends."""
    node, i = root, 0
    while i < len(prefix):
        child = node.children.get(prefix[i])
        if child is None:
            leaf = PrefixNode(list(prefix[i:]), parent=node)
            node.children[prefix[i]] = leaf
            return leaf
        shared = _common_prefix_length(child.tokens, prefix[i:])
        if shared < len(child.tokens):  # split child into child.tokens[:shared] -> rest
            head = PrefixNode(child.tokens[:shared], parent=node)
            node.children[prefix[i]] = head
            child.tokens, child.parent = child.tokens[shared:], head
            head.children[child.tokens[0]] = child
            child = head
        node, i = child, i + shared
    return node
