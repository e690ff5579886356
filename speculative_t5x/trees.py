"""Static draft trees: which drafts the target verifies in one call, and how they attend.

A tree has M draft nodes below a root. The root is the pending token x_length (the token the
target continues from); a node's draft is one candidate for the token after its parent's. Block
index b names a slot of the verification block: b = 0 is the root, b = 1..M the nodes, in
breadth-first order with the children of a node contiguous and in sibling order. Node i (0-based,
i = 0..M-1) sits at block index i + 1.

A node at depth d (1 = a child of the root) holds a candidate for position length + d, so its
relative position in T5's attention is its depth: block slot b is at position length + depth[b].
A block slot sees the cached prefix and its own ancestors, itself included (`visible`).

`DraftTree.from_branching((k_1, ..., k_D))`: every node at depth d - 1 has k_d children;
`(1,) * gamma` is the chain of Algorithm 1, `(4, 1, 1, 1)` is 4 chains of 4 sharing the root.
`DraftTree(parents)` is any static tree in that order.

Shapes: B batch, M nodes, D depth (the longest root-to-leaf path), K the most children of a slot.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import gin
import numpy as np


@gin.configurable(module="trees")
@dataclasses.dataclass(frozen=True)
class DraftTree:
  """A static draft tree given by its nodes' parents.

  parents: for node i = 0..M-1, the block index of its parent (0: the root; j >= 1: node j - 1).
    Breadth-first with contiguous siblings means parents is non-decreasing and parents[i] <= i.
  """

  parents: tuple[int, ...]

  def __post_init__(self):
    parents = self.parents
    if isinstance(parents, (str, bytes)) or not isinstance(parents, (tuple, list)):
      raise ValueError(
          f"DraftTree.parents must be a tuple of block indices, got {parents!r}: use "
          "DraftTree.from_branching((k_1, ..., k_D)) for a tree with k_d children per node."
      )
    if not parents:
      raise ValueError("DraftTree.parents is empty: a draft tree needs at least one node.")
    for i, parent in enumerate(parents):
      if isinstance(parent, bool) or not isinstance(parent, (int, np.integer)):
        raise ValueError(f"DraftTree.parents[{i}] must be an integer, got {parent!r}.")
      if not 0 <= parent <= i:
        raise ValueError(
            f"DraftTree.parents[{i}] = {parent} must be in [0, {i}]: node {i} is block slot "
            f"{i + 1}, and its parent must come before it (0 is the root)."
        )
      if i and parent < parents[i - 1]:
        raise ValueError(
            f"DraftTree.parents must be non-decreasing (breadth-first order, siblings "
            f"contiguous), but parents[{i}] = {parent} < parents[{i - 1}] = {parents[i - 1]}: "
            "renumber the nodes level by level."
        )
    object.__setattr__(self, "parents", tuple(int(p) for p in parents))

  @classmethod
  def from_branching(cls, branching: Sequence[int]) -> "DraftTree":
    """The full tree in which every node at depth d - 1 has branching[d - 1] children."""
    if isinstance(branching, (str, bytes)) or not isinstance(branching, (tuple, list)):
      raise ValueError(
          f"a draft tree's branching must be a tuple (k_1, ..., k_D) of children per depth, "
          f"got {branching!r}: e.g. (4, 1, 1, 1) for 4 chains of 4."
      )
    if not branching:
      raise ValueError("a draft tree's branching is empty: give at least one depth, e.g. (2,).")
    for d, k in enumerate(branching):
      if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(
            f"a draft tree's branching must hold integers >= 1 (children per node), got "
            f"{k!r} at depth {d + 1} in {tuple(branching)!r}."
        )
    parents = []
    level = [0]  # block indices of the previous level
    for k in branching:
      next_level = []
      for parent in level:
        for _ in range(k):
          parents.append(parent)
          next_level.append(len(parents))
      level = next_level
    return cls(tuple(parents))

  @classmethod
  def chain(cls, gamma: int) -> "DraftTree":
    """Algorithm 1's chain of gamma drafts."""
    return cls.from_branching((1,) * gamma)

  # ---- sizes
  @property
  def num_nodes(self) -> int:
    """M, the drafts per call."""
    return len(self.parents)

  @property
  def width(self) -> int:
    """M + 1, the tokens the target scores per call (the root and the nodes)."""
    return len(self.parents) + 1

  @functools.cached_property
  def depths(self) -> np.ndarray:
    """[M + 1] int32: the depth of every block slot (0 for the root)."""
    depths = np.zeros(self.width, np.int32)
    for i, parent in enumerate(self.parents):
      depths[i + 1] = depths[parent] + 1
    return depths

  @property
  def depth(self) -> int:
    """D, the most tokens a call can accept (the longest root-to-leaf path)."""
    return int(self.depths.max())

  @property
  def is_chain(self) -> bool:
    return self.parents == tuple(range(len(self.parents)))

  # ---- structure
  @functools.cached_property
  def visible(self) -> np.ndarray:
    """[M + 1, M + 1] bool: visible[a, b] iff slot b is an ancestor of slot a or a itself."""
    visible = np.eye(self.width, dtype=bool)
    for i, parent in enumerate(self.parents):
      visible[i + 1] |= visible[parent]
    return visible

  @functools.cached_property
  def children(self) -> np.ndarray:
    """[M + 1, K] int32: the block indices of each slot's children in sibling order, -1 padded
    (K = the most children of any slot)."""
    lists = [[] for _ in range(self.width)]
    for i, parent in enumerate(self.parents):
      lists[parent].append(i + 1)
    most = max(len(c) for c in lists)
    table = np.full((self.width, most), -1, np.int32)
    for slot, kids in enumerate(lists):
      table[slot, : len(kids)] = kids
    return table

  @functools.cached_property
  def levels(self) -> tuple[tuple[int, int], ...]:
    """For depth d = 0..D, the block slots [start, stop) at that depth (contiguous)."""
    return tuple(
        (int(np.argmax(self.depths == d)), int(self.width - np.argmax(self.depths[::-1] == d)))
        for d in range(self.depth + 1)
    )

  @functools.cached_property
  def paths(self) -> np.ndarray:
    """[M + 1, D] int32: the block indices of the path root -> slot (depths 1..D), padded with d
    beyond the slot's depth (a no-op move: cache slots past an accepted path are overwritten)."""
    paths = np.tile(np.arange(1, self.depth + 1, dtype=np.int32), (self.width, 1))
    for slot in range(1, self.width):
      paths[slot] = paths[self.parents[slot - 1]]
      paths[slot, self.depths[slot] - 1] = slot
    return paths

  def path_nodes_per_depth(self) -> np.ndarray:
    """[D] int: how many nodes each depth has (N_1..N_D)."""
    return np.bincount(self.depths[1:], minlength=self.depth + 1)[1:]


def as_tree(tree: "DraftTree | Sequence[int] | None") -> DraftTree | None:
  """None, a `DraftTree`, or a branching (k_1, ..., k_D) as its `DraftTree.from_branching`."""
  if tree is None or isinstance(tree, DraftTree):
    return tree
  return DraftTree.from_branching(tree)
