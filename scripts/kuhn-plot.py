#!/usr/bin/env python3
"""Plots Kuhn poker learning curves written by scripts/kuhn-curve.sh: the exact EV against
`always-bet` (and the illegal mass) per evaluated version over the RL wall time, one line per
file, with the best response (+1/3) and the target band (within 0.05 of it).

    scripts/kuhn-plot.py OUT.png CURVE.json [CURVE.json ...]

Needs matplotlib (not a dependency of the node: any venv with it).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, files = sys.argv[1], sys.argv[2:]
    fig, (ev_ax, ill_ax) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    # One colour per seed, one line style per learning rate.
    colours, styles = {}, {}
    for f in files:
        d = json.load(open(f))
        curve = d["curve"]
        t = [r["t_rl_s"] / 60 for r in curve]
        lr = d["summary"].get("lr")
        label = f"seed {d['seed']}" + (f", lr {lr:g}" if lr else "")
        colour = colours.setdefault(d["seed"], f"C{len(colours)}")
        style = styles.setdefault(lr, ["-", "--", ":", "-."][len(styles) % 4])
        for ax, key in ((ev_ax, "ev"), (ill_ax, "illegal_mass")):
            ax.plot(t, [r[key] for r in curve], label=label, color=colour, ls=style)
    br = 1 / 3
    ev_ax.axhline(br, color="k", lw=0.8, ls="--", label="best response +1/3")
    ev_ax.axhspan(br - 0.05, br, color="g", alpha=0.1, label="target")
    ev_ax.set_ylabel("exact EV vs always-bet")
    ev_ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ill_ax.axhline(0.05, color="g", lw=0.8, ls="--", label="target ≤ 0.05")
    ill_ax.set_ylabel("illegal mass (12 info sets)")
    ill_ax.set_xlabel("minutes of RL")
    ill_ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main()
