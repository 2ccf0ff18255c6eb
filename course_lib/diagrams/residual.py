"""Chapter 10's picture: the residual stream as a running sum.

    residual_stream(model, tokens)        the embedding and every sub-layer's addition, read off
                                          a real forward pass, and the stream they sum to
    draw_residual_stream(stream, labels)  how much each addition writes at every position, and
                                          one position's sum drawn head to tail

In a pre-LN transformer nothing overwrites a token's vector: block i adds attn_i, then mlp_i,
so the vector the final LayerNorm reads is x_0 + attn_0 + mlp_0 + attn_1 + ... The parts are
recorded with forward hooks on the model's own modules (the embedding, each block's `attn` and
`mlp`, the final LayerNorm's input) during one ordinary forward pass, so the numbers drawn are
the ones the model computed.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from course_lib.validate import check_count, wrong_shape


@torch.no_grad()
def residual_stream(model: torch.nn.Module, tokens: torch.Tensor) -> dict:
    """Run `model` (a `TinyTransformer`, with or without MLPs) on tokens (B, n) and return
    {"names": ["embedding", "attn 0", "mlp 0", ...], "parts": (parts, B, n, d_model),
    "final": (B, n, d_model), the stream the final LayerNorm read}. parts.sum(0) == final
    up to float rounding."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        raise wrong_shape("tokens", tokens, "(batch, n) token ids")
    recorded: list[tuple[str, torch.Tensor]] = []
    final: list[torch.Tensor] = []

    def keep(name):
        def hook(module, inputs, output):
            out = output[0] if isinstance(output, tuple) else output  # attn returns (out, w)
            recorded.append((name, out.detach().clone()))
        return hook

    modules = [("embedding", model.embed)]
    for i, block in enumerate(model.blocks):
        modules.append((f"attn {i}", block.attn))
        if getattr(block, "mlp", None) is not None:
            modules.append((f"mlp {i}", block.mlp))
    handles = [module.register_forward_hook(keep(name)) for name, module in modules]
    handles.append(model.ln_f.register_forward_hook(
        lambda module, inputs, output: final.append(inputs[0].detach().clone())))
    was = model.training
    model.eval()
    try:
        model(tokens)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was)
    return {"names": [name for name, _ in recorded],
            "parts": torch.stack([part for _, part in recorded]),  # (parts, B, n, d)
            "final": final[0]}


def _plane(vectors: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The 2 directions that hold most of the vectors' (parts, d) squared length, and the
    fraction they hold."""
    _, s, vh = torch.linalg.svd(vectors.double(), full_matrices=False)
    return vh[:2].to(vectors.dtype), float((s[:2] ** 2).sum() / (s ** 2).sum())


def draw_residual_stream(stream: dict, labels, position: int, example: int = 0,
                         title: str = "the residual stream"):
    """Left: the length |part| of every addition at every position of sequence `example`.
    Right: position `position`'s parts drawn head to tail in the plane that holds most of them;
    the chain ends where the final stream projects (a star). Returns (fig, numbers), numbers
    holding the norms drawn, the projected parts and the plane's share."""
    names, parts = stream["names"], stream["parts"][:, example]  # (P, n, d)
    n = parts.shape[1]
    position = check_count(position, "position", minimum=0)
    if position >= n:
        raise ValueError(f"position must be in 0..{n - 1}, got {position}")
    if len(labels) != n:
        raise ValueError(f"labels has {len(labels)} entries for {n} positions")
    norms = parts.norm(dim=-1)  # (P, n)
    at = parts[:, position]  # (P, d)
    plane, share = _plane(at)
    flat = at @ plane.T  # (P, 2): each part in the plane
    ends = flat.cumsum(dim=0)  # (P, 2): the running sum after each addition
    final = stream["final"][example, position] @ plane.T  # (2,)

    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 4.0),
                                      gridspec_kw={"width_ratios": [1.8, 1]})
    image = left.imshow(norms.numpy(), aspect="auto", cmap="magma")
    left.set_xticks(range(n), labels)
    left.set_yticks(range(len(names)), names)
    left.axvline(position, color="#38bdf8", lw=1.0, ls="--")
    left.set_xlabel(f"token (dashed: position {position}, drawn on the right)")
    left.set_title(f"{title}: the length of what each part adds")
    fig.colorbar(image, ax=left, label="|part| (norm of the vector added)", fraction=0.04)

    colours = plt.get_cmap("tab10")
    start = torch.zeros(2)
    for i, name in enumerate(names):
        end = ends[i]
        right.annotate("", xy=end.tolist(), xytext=start.tolist(),
                       arrowprops={"arrowstyle": "-|>", "color": colours(i), "lw": 2})
        right.plot([], [], color=colours(i), lw=2, label=f"+ {name}" if i else name)
        start = end
    right.plot(*final.tolist(), marker="*", ms=14, color="black", ls="", label="final stream")
    right.plot(0, 0, marker="o", ms=4, color="grey")
    points = torch.cat([torch.zeros(1, 2), ends, final[None]])
    pad = 0.12 * float((points.max(0).values - points.min(0).values).max())
    right.set_xlim(float(points[:, 0].min()) - pad, float(points[:, 0].max()) + pad)
    right.set_ylim(float(points[:, 1].min()) - pad, float(points[:, 1].max()) + pad)
    right.set_aspect("equal")
    right.set_xlabel(f"direction 1 (the plane holds {share:.0%} of the parts' squared length)",
                     fontsize=8)
    right.set_ylabel("direction 2", fontsize=8)
    right.set_title(f"position {position} ({labels[position]!r}): the sum, head to tail")
    right.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    fig.tight_layout()
    return fig, {"norms": norms, "projected": flat, "ends": ends, "final": final,
                 "share": share}
