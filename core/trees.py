"""A batch's targets as a tree: a leaf (a tensor, an array, a placed slice), or tuples and
lists of trees (the padded layout's (boxes, counts), the ragged layout's list of boxes).
One walk for every place that maps or lists them."""


def map_leaves(fn, tree):
    """The tree with fn applied to each leaf, its tuples and lists kept as they are."""
    if isinstance(tree, (tuple, list)):
        return type(tree)(map_leaves(fn, part) for part in tree)
    return fn(tree)


def leaves(tree):
    """Every leaf, in order."""
    if isinstance(tree, (tuple, list)):
        for part in tree:
            yield from leaves(part)
    else:
        yield tree
