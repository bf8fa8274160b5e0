"""What a party can show of a trained model (``vfl trees``): the trees as the active party sees
them, and a passive party's own lookup table.

The active party knows the structure of every tree, its own splits (feature, threshold, side of
missing values) and the leaves; of a passive party's split it knows only who holds it and an
opaque record number, so such a node reads ``telco:record#7`` and has no threshold. A passive
party knows no tree at all: its view is its record table, record number -> its own feature,
threshold and missing side (what the active party's ``telco:record#7`` stands for).
"""
from __future__ import annotations

from vfl.core.model import BoostedModel
from vfl.core.tree import Node, Tree


def _f(v: float) -> str:
    return f"{v:.6g}"


def split_label(node: Node) -> str:
    """``age <= 42.5``, ``segment in {1, 3}`` (active splits) or ``telco:record#7`` (passive)."""
    if node.owner is not None and node.record_id >= 0 and node.feature is None:
        return f"{node.owner}:record#{node.record_id}"
    if node.categories is not None:
        return f"{node.feature} in {{{', '.join(str(c) for c in node.categories)}}}"
    return f"{node.feature} <= {_f(node.threshold)}"


def _missing(node: Node) -> str:
    if node.default_left is None:
        return ""
    return f", missing {'left' if node.default_left else 'right'}"


def tree_lines(tree: Tree) -> list[str]:
    """One line per node, children indented under their parent (left: the condition holds)."""
    lines: list[str] = []

    def walk(i: int, depth: int, branch: str) -> None:
        node = tree.nodes[i]
        pad = "  " * depth + branch
        if node.is_leaf:
            lines.append(f"{pad}leaf {_f(node.value)} ({node.n_samples} rows)")
            return
        lines.append(f"{pad}[{split_label(node)}{_missing(node)}] gain {_f(node.gain)}, {node.n_samples} rows")
        walk(node.left, depth + 1, "yes: ")
        walk(node.right, depth + 1, "no:  ")

    if tree.nodes:
        walk(0, 0, "")
    return lines


def active_view(model: BoostedModel) -> str:
    """Every tree of ``model`` as text (round, class for multiclass), as its active party sees it."""
    out = [f"model {model.model_id}: {model.objective}, {model.n_rounds} round(s), active party "
           f"{model.active_party}, passive parties {', '.join(model.passives) or '-'}"
           + (f"; predictions use rounds 1..{model.default_rounds}" if model.default_rounds != model.n_rounds
              else "")]
    for r, trees in enumerate(model.rounds):
        for k, tree in enumerate(trees):
            out.append("")
            out.append(f"round {r + 1}" + (f", class {k}" if len(trees) > 1 else "") + ":")
            out += ["  " + line for line in tree_lines(tree)]
    return "\n".join(out)


def passive_view(party: str, model_id: str, records: list[dict]) -> str:
    """A passive party's own record table (what its splits are), thresholds included."""
    out = [f"party {party}, model {model_id}: {len(records)} split(s) held (the active party sees each as "
           f"{party}:record#k)"]
    for r in records:
        if r.get("categories"):
            cond = f"{r['feature']} in {{{', '.join(str(c) for c in r['categories'])}}}"
        else:
            cond = f"{r['feature']} <= {_f(r['threshold'])}"
        side = "" if r.get("default_left") is None else f", missing {'left' if r['default_left'] else 'right'}"
        gain = f", gain {_f(r['gain'])}" if "gain" in r else ""
        out.append(f"  record#{r['record_id']}: {cond}{side} (round {r['round'] + 1}{gain})")
    return "\n".join(out)


def plot_tree(tree: Tree, ax, title: str = "") -> None:
    """Draw ``tree`` on a matplotlib axes: splits as boxes (passive ones as ``party:record#k``),
    leaves with their values, the left ("yes") child on the left."""
    pos: dict[int, tuple[float, float]] = {}
    leaves = [0]

    def place(i: int) -> float:
        node = tree.nodes[i]
        if node.is_leaf:
            x = leaves[0]
            leaves[0] += 1
        else:
            x = (place(node.left) + place(node.right)) / 2
        pos[i] = (x, -node.depth)
        return x

    if not tree.nodes:
        return
    place(0)
    width = max(leaves[0] - 1, 1)
    for i, node in enumerate(tree.nodes):
        x, y = pos[i]
        if not node.is_leaf:
            for child, word in ((node.left, "yes"), (node.right, "no")):
                cx, cy = pos[child]
                ax.plot([x, cx], [y, cy], color="0.6", lw=0.8, zorder=1)
                ax.text((x + cx) / 2, (y + cy) / 2, word, fontsize=6, color="0.4", ha="center")
        passive = node.owner is not None and node.feature is None and not node.is_leaf
        text = f"{_f(node.value)}" if node.is_leaf else split_label(node)
        ax.text(x, y, text, ha="center", va="center", fontsize=7, zorder=2,
                bbox=dict(boxstyle="round,pad=0.3", lw=0.6,
                          fc="#e8f0fb" if node.is_leaf else ("#fde9d9" if passive else "#e6f4e6")))
    ax.set_xlim(-0.6, width + 0.6)
    ax.set_ylim(-tree.max_depth - 0.6, 0.6)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=9)
