"""Draws the README's two figures: the MeSH slot buffer across the loops, and the T²MLR token-by-sweep grid.

    python assets/draw_ideas.py        # writes assets/mesh_slots.png and assets/t2mlr_grid.png

matplotlib only, no repository imports; the drawings are schematic (the routing weights in the MeSH figure are
made-up numbers that only show a soft, per-step routing), so the output is the same on every run.
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
matplotlib.rcParams.update({"font.size": 12, "font.family": "DejaVu Sans", "svg.hashsalt": "0",
                            "path.simplify": False})

BLUE, ORANGE, GREEN, GREY, RED = "#3b6ea8", "#d9822b", "#3a9a5b", "#9a9a9a", "#c0392b"


def box(ax, x, y, w, h, text, color, fontsize=12, text_color="white", alpha=1.0, weight="bold"):
    """A rounded box centred at (x, y)."""
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                fc=color, ec="black", lw=1.0, alpha=alpha, zorder=3))
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize, color=text_color, weight=weight, zorder=4)


def arrow(ax, start, end, color="black", lw=1.5, style="-|>", alpha=1.0, mutation=14, ls="-", rad=0.0, z=2):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=mutation, color=color, lw=lw,
                                 alpha=alpha, linestyle=ls, connectionstyle=f"arc3,rad={rad}", zorder=z,
                                 shrinkA=0, shrinkB=0))


# -----------------------------------------------------------------------------
# (a) MeSH: the buffer of n_slots slots across the transitional step and the K loops (layout 2+4R2+2, K = 2)

def draw_mesh(path):
    n_slots, K = 5, 2
    fig, ax = plt.subplots(figsize=(13, 5.4))
    ax.set_xlim(-0.3, 17.0)
    ax.set_ylim(-0.75, 6.85)
    ax.axis("off")

    lane_y = [5.2 - 0.75 * i for i in range(n_slots)]          # m_0 at the top
    path_y = 0.6                                               # the computation path
    # made-up routing weights (each row sums to 1): soft, different per step
    w_write = [[0.10, 0.45, 0.20, 0.15, 0.10], [0.10, 0.15, 0.50, 0.15, 0.10], [0.05, 0.10, 0.15, 0.55, 0.15]]
    w_read = [[0.30, 0.40, 0.10, 0.10, 0.10], [0.15, 0.20, 0.45, 0.10, 0.10], [0.10, 0.10, 0.20, 0.45, 0.15]]
    step_x = [3.4, 7.9, 12.4]                                   # write column of step k; read at +0.9
    titles = ["step 0 (transitional)\nrouters see h_pre", "step 1 (after loop 0)\nrouters see h(0)",
              "step 2 (after loop 1)\nrouters see h(1)"]
    bar = 1.3                                                   # bar length of weight 1

    # the slot lanes
    for i, y in enumerate(lane_y):
        ax.plot([1.5, 14.7], [y, y], color=GREY, lw=4, solid_capstyle="round", zorder=1, alpha=0.5)
        ax.text(0.0, y, f"m$_{i}$", ha="left", va="center", fontsize=14, weight="bold")
        ax.text(0.62, y, "h_emb" if i == 0 else "0", ha="left", va="center", fontsize=11,
                color=BLUE if i == 0 else "black", weight="bold" if i == 0 else None)
    ax.text(15.0, lane_y[2], f"n_slots = K+3 = {n_slots}\n\nno erase:\nthe slots\naccumulate",
            ha="left", va="center", fontsize=10.5, color="#444444")

    # the computation path
    box(ax, 0.55, path_y, 1.0, 0.75, "h_emb", BLUE, fontsize=11)
    box(ax, 1.95, path_y, 1.2, 0.75, "prelude", "#555555")
    arrow(ax, (1.05, path_y), (1.35, path_y))
    ax.text(0.62, lane_y[0] + 0.45, "start", ha="left", va="bottom", fontsize=11, color="#444444")
    reads = ["h(0)", "h(1)", "h(2)"]
    prev_out = 2.55                                             # right edge of the box whose output is written
    for k in range(K + 1):
        xw, xr = step_x[k], step_x[k] + 0.9
        written = "y_0 = h_pre" if k == 0 else f"y_{k} = f_core(h({k - 1}))"
        arrow(ax, (prev_out, path_y), (xw, path_y), lw=1.5)
        ax.text(xw, path_y - 0.68, written, ha="right" if k else "center", va="center", fontsize=10.5)
        # write: the written state goes up to every slot; bars left of the column show w_w per slot
        ax.plot([xw, xw], [path_y, lane_y[0]], color=ORANGE, lw=2.2, zorder=2)
        # read: every (updated) slot comes down to the read state; bars right of the column show w_r
        ax.plot([xr, xr], [lane_y[0], path_y], color=GREEN, lw=2.2, zorder=2)
        for i, y in enumerate(lane_y):
            ww, wr = w_write[k][i], w_read[k][i]
            ax.add_patch(Rectangle((xw - 0.2 - bar * ww, y - 0.16), bar * ww, 0.32, fc=ORANGE, ec="none",
                                   alpha=0.85, zorder=4))
            ax.add_patch(Rectangle((xr + 0.2, y - 0.16), bar * wr, 0.32, fc=GREEN, ec="none", alpha=0.85,
                                   zorder=4))
            ax.text(xw, y, "+", ha="center", va="center", fontsize=13, weight="bold", color=ORANGE, zorder=5,
                    bbox=dict(boxstyle="circle,pad=0.08", fc="white", ec=ORANGE, lw=1.2))
            ax.plot([xr], [y], marker="o", color=GREEN, ms=7, zorder=5)
        ax.text((xw + xr) / 2, lane_y[0] + 0.45, titles[k], ha="center", va="bottom", fontsize=11.5)
        ax.text(xw - 0.1, lane_y[-1] - 0.6, "write  w_w", ha="right", va="center", fontsize=10.5, color=ORANGE,
                weight="bold")
        ax.text(xr + 0.1, lane_y[-1] - 0.6, "read  w_r", ha="left", va="center", fontsize=10.5, color=GREEN,
                weight="bold")
        # the read state, then the core (loops) or the coda
        box(ax, xr + 0.75, path_y, 0.95, 0.7, reads[k], GREEN, fontsize=12)
        arrow(ax, (xr, path_y), (xr + 0.27, path_y), color=GREEN, lw=1.5)
        if k < K:
            arrow(ax, (xr + 1.23, path_y), (xr + 1.55, path_y), lw=1.5)
            box(ax, xr + 2.25, path_y, 1.4, 0.85, f"core\nloop {k}", BLUE, fontsize=11.5)
            prev_out = xr + 2.95
        else:
            arrow(ax, (xr + 1.23, path_y), (xr + 1.55, path_y), lw=1.5)
            box(ax, xr + 2.1, path_y, 1.1, 0.75, "coda", "#555555", fontsize=11.5)
            arrow(ax, (xr + 2.65, path_y), (xr + 3.0, path_y), lw=1.5)
            ax.text(xr + 3.05, path_y, "logits", ha="left", va="center", fontsize=11)
    ax.text(7.6, -0.45, "the two core boxes are one set of weights, looped K = 2 times;  "
            "bar length = routing weight (a softmax over the slots, per token)",
            ha="center", va="center", fontsize=10.5, color="#444444")
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)


# -----------------------------------------------------------------------------
# (b) T²MLR: tokens along x, Jacobi sweeps along y, the exactness front

def draw_t2mlr(path):
    T, D = 8, 5                                               # tokens shown, sweeps shown (the final one on top)
    fig, ax = plt.subplots(figsize=(13, 6.2))
    ax.set_xlim(-2.5, T * 1.5 + 3.9)
    ax.set_ylim(-1.85, D + 1.25)
    ax.axis("off")
    cw, ch = 0.95, 0.62                                       # cell size; cell (t, j) centred at (1.5 t, j)
    DARK = "#1f3f66"

    def cx(t):
        return 1.5 * t

    # row 0: the zero start R^(0) = 0
    for t in range(T):
        ax.add_patch(Rectangle((cx(t) - cw / 2, -ch / 2), cw, ch, fc="white", ec=GREY, lw=1, ls="--", zorder=3))
        ax.text(cx(t), 0, "0", ha="center", va="center", fontsize=11, color=GREY, zorder=4)
    ax.text(-0.75, 0, "start\nR$^{(0)}$ = 0", ha="right", va="center", fontsize=11)
    for j in range(1, D + 1):
        label = f"sweep {j}" if j < D else f"final sweep\n(j = D = {D})"
        ax.text(-0.75, j, label, ha="right", va="center", fontsize=11, weight="bold" if j == D else None)
        for t in range(T):
            exact = t < j                                       # its input state R^(j-1)[t] is exact for t <= j-1
            x0, y0 = cx(t) - cw / 2, j - ch / 2
            ax.add_patch(Rectangle((x0, y0), cw, ch, fc=GREEN if exact else "#dadada", ec="black", lw=0.8,
                                   zorder=3))
            ax.add_patch(Rectangle((x0, y0), cw, 0.17, fc=ORANGE, ec="black", lw=0.8, zorder=4))   # gate strip
            ax.text(cx(t), j + 0.08, "middle", ha="center", va="center", fontsize=9.5, zorder=5,
                    color="white" if exact else "#555555")
    # the state arrows: R written by token t-1 (its l_end output, the cell's top right) in sweep j-1 -> the gate
    # (the bottom strip, at layer l_start) of token t in sweep j
    hi_t, hi_j = 4, 2
    for j in range(1, D + 1):
        for t in range(1, T):
            src = (cx(t - 1) + cw / 2 - 0.05, j - 1 + (ch / 2 - 0.03 if j > 1 else 0.0))
            dst = (cx(t) - cw / 2 + 0.1, j - ch / 2 + 0.06)
            hi = (t, j) == (hi_t, hi_j)
            arrow(ax, src, dst, color=DARK if hi else "#555555", lw=2.6 if hi else 1.0, mutation=15 if hi else 11,
                  alpha=1.0 if hi else 0.7, z=6)
    ax.text(cx(hi_t) - 0.28, hi_j - 0.52, "R$_3$", ha="left", va="center", fontsize=12, color=DARK,
            weight="bold", zorder=7, bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.9))
    # the exactness front: a staircase between the exact and the not yet exact cells
    front_x, front_y = [], []
    for j in range(1, D + 1):
        front_x += [cx(j) - 0.75, cx(j) - 0.75]
        front_y += [j - 0.5, j + 0.5]
    front_y[-1] = D + 0.9
    ax.plot(front_x, front_y, color=RED, lw=3.2, zorder=8, solid_joinstyle="miter")
    ax.text(cx(D) - 0.6, D + 1.0, "exactness front: one position per sweep", ha="left", va="center",
            fontsize=11.5, color=RED, weight="bold")
    # the final sweep goes on to the upper layers
    for t in range(T):
        arrow(ax, (cx(t), D + ch / 2), (cx(t), D + 0.8), color="#555555", lw=1.2, mutation=10)
    ax.text(-0.75, D + 0.72, "upper layers\n→ logits", ha="right", va="center", fontsize=11)
    # token axis
    for t in range(T):
        ax.text(cx(t), -0.6, f"t = {t}", ha="center", va="center", fontsize=11)
    ax.text(cx(T - 1) / 2, -1.05, "token position t  →", ha="center", va="center", fontsize=12)
    ax.text(cx(T - 1) / 2 + 0.6, -1.6, f"D = {D}: positions 0..{D - 1} of the final sweep equal the exact "
            "token-by-token recurrence; later ones are approximations (all exact when D ≥ T)",
            ha="center", va="center", fontsize=10.5, color="#444444")
    # legend
    lx, ly = cx(T) - 0.2, D - 0.2
    ax.text(lx, ly, "one cell = the middle layers\nl_start..l_end of one token\nin one sweep", ha="left",
            va="center", fontsize=10.5)
    items = [(GREEN, 0.36, "exact"), ("#dadada", 0.36, "not yet exact"), (ORANGE, 0.14, "the gate, at the\n"
                                                                                      "input of l_start")]
    for n, (color, hgt, text) in enumerate(items):
        y = ly - 1.05 - 0.55 * n - (0.1 if n == 2 else 0)
        ax.add_patch(Rectangle((lx, y - hgt / 2), 0.5, hgt, fc=color, ec="black", lw=0.8))
        ax.text(lx + 0.65, y, text, va="center", fontsize=10.5)
    y = ly - 3.05
    arrow(ax, (lx, y - 0.2), (lx + 0.5, y + 0.2), color=DARK, lw=2.4, mutation=14)
    ax.text(lx + 0.65, y, "R$_{t-1}$: written by token t−1\n(output of l_end) in sweep j−1,\n"
            "read by token t in sweep j", va="center", fontsize=10.5, color=DARK)
    ax.text(lx, ly - 4.2, "every sweep reads the same\nx = lower layers(h_emb)", ha="left", va="center",
            fontsize=10.5, color="#444444")
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)


if __name__ == "__main__":
    draw_mesh(os.path.join(HERE, "mesh_slots.png"))
    draw_t2mlr(os.path.join(HERE, "t2mlr_grid.png"))
    print("wrote assets/mesh_slots.png, assets/t2mlr_grid.png")
