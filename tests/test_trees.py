"""Static draft trees: structure worked out by hand, and refused shapes."""

import numpy as np
import pytest

from speculative_t5x import trees


def test_a_branching_tree_worked_out_by_hand():
  # (2, 2, 1): the root has 2 children (slots 1, 2), each has 2 (3, 4 under 1; 5, 6 under 2),
  # each of those 1 (7..10).
  tree = trees.DraftTree.from_branching((2, 2, 1))
  assert tree.parents == (0, 0, 1, 1, 2, 2, 3, 4, 5, 6)
  assert (tree.num_nodes, tree.width, tree.depth) == (10, 11, 3)
  np.testing.assert_array_equal(tree.depths, [0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3])
  assert tree.levels == ((0, 1), (1, 3), (3, 7), (7, 11))
  np.testing.assert_array_equal(tree.children[:3], [[1, 2], [3, 4], [5, 6]])
  np.testing.assert_array_equal(tree.children[3], [7, -1])
  np.testing.assert_array_equal(tree.children[7:], -1)
  # Slot 9 is reached through 2 -> 5 -> 9; slot 2 through 2 only (then the padding d).
  np.testing.assert_array_equal(tree.paths[9], [2, 5, 9])
  np.testing.assert_array_equal(tree.paths[2], [2, 2, 3])
  np.testing.assert_array_equal(tree.paths[0], [1, 2, 3])
  assert tree.visible[9].nonzero()[0].tolist() == [0, 2, 5, 9]
  assert tree.visible[4].nonzero()[0].tolist() == [0, 1, 4]
  np.testing.assert_array_equal(tree.path_nodes_per_depth(), [2, 4, 4])
  assert not tree.is_chain


def test_the_chain_is_algorithm_1s_block():
  chain = trees.DraftTree.chain(4)
  assert chain.is_chain and chain == trees.DraftTree.from_branching((1, 1, 1, 1))
  assert chain.parents == (0, 1, 2, 3) and chain.depth == 4
  np.testing.assert_array_equal(chain.visible, np.tril(np.ones((5, 5), bool)))
  np.testing.assert_array_equal(chain.paths[4], [1, 2, 3, 4])


def test_k_chains_share_their_root():
  tree = trees.DraftTree.from_branching((4, 1, 1, 1))
  assert tree.num_nodes == 16 and tree.depth == 4
  # The chains are 1-5-9-13, 2-6-10-14, ...: level by level, siblings contiguous.
  np.testing.assert_array_equal(tree.paths[14], [2, 6, 10, 14])
  assert tree.visible[14].nonzero()[0].tolist() == [0, 2, 6, 10, 14]


def test_a_general_tree():
  # Root -> slots 1, 2, 3; slot 1 -> 4, 5; slot 3 -> 6; slot 4 -> 7.
  tree = trees.DraftTree((0, 0, 0, 1, 1, 3, 4))
  np.testing.assert_array_equal(tree.depths, [0, 1, 1, 1, 2, 2, 2, 3])
  np.testing.assert_array_equal(tree.children[0], [1, 2, 3])
  np.testing.assert_array_equal(tree.children[3], [6, -1, -1])
  np.testing.assert_array_equal(tree.paths[7], [1, 4, 7])
  np.testing.assert_array_equal(tree.paths[6], [3, 6, 3])
  np.testing.assert_array_equal(tree.path_nodes_per_depth(), [3, 3, 1])


def test_as_tree():
  assert trees.as_tree(None) is None
  tree = trees.DraftTree((0, 1))
  assert trees.as_tree(tree) is tree
  assert trees.as_tree((2, 1)) == trees.DraftTree((0, 0, 1, 2))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: trees.DraftTree(()), "empty"),
        (lambda: trees.DraftTree("01"), "tuple of block indices"),
        (lambda: trees.DraftTree((0, 2)), r"parents\[1\] = 2 must be in \[0, 1\]"),
        (lambda: trees.DraftTree((0, -1)), "must be in"),
        (lambda: trees.DraftTree((0, 0, 1, 0)), "non-decreasing"),
        (lambda: trees.DraftTree((0, 1.0)), "must be an integer"),
        (lambda: trees.DraftTree.from_branching(()), "empty"),
        (lambda: trees.DraftTree.from_branching((2, 0)), "at depth 2"),
        (lambda: trees.DraftTree.from_branching(3), "tuple"),
        (lambda: trees.DraftTree.from_branching((2, True)), "integers >= 1"),
    ],
)
def test_bad_trees_are_refused(make, message):
  with pytest.raises(ValueError, match=message):
    make()
