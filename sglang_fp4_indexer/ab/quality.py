"""The A/B's quality checks against a running server: SGLang's few-shot GSM8K and a long-context passkey.

GSM8K is SGLang's own ``python -m sglang.test.few_shot_gsm8k`` run as a subprocess on a local data file (no
network); its per-question answers are read back from the state dump it writes in its working folder
(``tmp_output_gsm8k.txt``) and scored with SGLang's own answer reader, so the A/B can pair FP4 and FP8 question
by question. The passkey prompts are built here: filler text of a measured token length with a five-digit key
placed at a given depth, the same prompts for both servers (kept in the output folder).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from urllib.parse import urlsplit

from ..serving import client_error, post_json

#: The shortest passkey prompt in tokens: the key's sentences and the question take about this many.
PASSKEY_MIN_TOKENS = 64

__all__ = [
    "GSM8K_DUMP",
    "PASSKEY_MIN_TOKENS",
    "gsm8k_command",
    "gsm8k_outcomes",
    "passkey_prompts",
    "run_gsm8k",
    "passkey_outcome",
    "run_passkey",
    "tokens_per_filler",
]

#: The state dump ``sglang.test.few_shot_gsm8k`` writes in its working folder (one block per question).
GSM8K_DUMP = "tmp_output_gsm8k.txt"
_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
_HEAD = ("There is an important piece of information hidden inside a lot of irrelevant text. Find it and "
         "memorize it. I will quiz you about it.\n")
_TAIL = "\nWhat is the pass key? The pass key is"


def _host_port(base_url: str) -> tuple[str, int]:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise ValueError(f"server URL: expected http://HOST:PORT, got {base_url!r}")
    return parts.hostname, parts.port


def gsm8k_command(base_url: str, data_path: str, questions: int, *, parallel: int = 64, shots: int = 5,
                  python: str = sys.executable) -> list[str]:
    """``python -m sglang.test.few_shot_gsm8k`` against ``base_url`` on the local JSONL ``data_path`` (GSM8K's
    ``test.jsonl``: ``question`` and ``answer`` per line), the first ``questions`` questions, greedy.

    Raises:
        ValueError: ``base_url`` is not ``http://HOST:PORT``, or ``questions``/``parallel`` < 1.
    """
    host, port = _host_port(base_url)
    if questions < 1 or parallel < 1:
        raise ValueError(f"questions, parallel: expected >= 1, got {questions}, {parallel}")
    return [python, "-m", "sglang.test.few_shot_gsm8k", "--data-path", os.path.abspath(data_path),
            "--num-questions", str(questions), "--num-shots", str(shots), "--parallel", str(parallel),
            "--host", host, "--port", str(port), "--temperature", "0"]


def gsm8k_outcomes(data_path: str, dump_text: str, questions: int, *, answer_value) -> list[int]:
    """Per-question outcomes (1 right, 0 wrong) of a few-shot GSM8K run, from its state dump.

    Each block of ``dump_text`` (``==== i ====`` then the program's text: the few-shot examples, the question
    and the model's answer) is matched to question ``i`` of ``data_path``; the text after that question's
    ``Question: ...\\nAnswer:`` is the model's answer, read (as the label) by ``answer_value``: SGLang's
    ``get_answer_value``, which the adapter hands in (``sglang_plugin.check_facts.gsm8k_answer_value``).

    Raises:
        ValueError: the dump does not hold ``questions`` blocks, or a block lacks its question's text.
    """
    with open(data_path) as f:
        lines = [json.loads(x) for x in f if x.strip() and not x.startswith("#")][:questions]
    blocks = re.split(r"^={40} (\d+) ={40}\n", dump_text, flags=re.M)
    texts = {int(blocks[i]): blocks[i + 1].rsplit("\n" + "=" * 80, 1)[0] for i in range(1, len(blocks) - 1, 2)}
    if sorted(texts) != list(range(len(lines))):
        raise ValueError(f"GSM8K dump: expected blocks 0..{len(lines) - 1}, found {len(texts)}")
    out = []
    for i, item in enumerate(lines):
        prompt = "Question: " + item["question"] + "\nAnswer:"
        text = texts[i]
        at = text.rfind(prompt)
        if at < 0:
            raise ValueError(f"GSM8K dump: block {i} does not hold question {i} of {data_path}")
        out.append(int(answer_value(text[at + len(prompt):]) == answer_value(item["answer"])))
    return out


def tokens_per_filler(base_url: str, timeout: float = 120.0) -> float:
    """Tokens one filler sentence group takes with the server's tokenizer: from the ``prompt_tokens`` SGLang
    reports for 200 and 400 repeats (one token generated each), so the fixed part cancels.

    Raises:
        RuntimeError: the server fails a request or reports no ``prompt_tokens``.
    """
    counts = []
    for reps in (200, 400):
        ans = post_json(base_url + "/generate", {"text": _FILLER * reps,
                                                 "sampling_params": {"max_new_tokens": 1, "temperature": 0}}, timeout)
        n = ans.get("meta_info", {}).get("prompt_tokens") if isinstance(ans.get("meta_info"), dict) else None
        if not isinstance(n, int):
            raise RuntimeError(f"{base_url}/generate: no prompt_tokens in the answer ({str(ans)[:200]})")
        counts.append(n)
    return (counts[1] - counts[0]) / 200


def passkey_prompts(lengths: list[int], depths: list[float], trials: int, per_filler: float,
                    seed: int = 0) -> list[dict]:
    """The passkey prompts: for each length (tokens), depth (fraction of the filler before the key) and trial, a
    five-digit key inside filler text sized to about ``length`` tokens (``per_filler`` tokens per filler group).

    Returns:
        list of dicts ``length``, ``depth``, ``trial``, ``key`` (str), ``text``.

    Raises:
        ValueError: a length < ``PASSKEY_MIN_TOKENS``, a depth outside [0, 1], ``trials`` < 1 or ``per_filler`` <= 0.
    """
    if trials < 1 or per_filler <= 0:
        raise ValueError(f"trials, per_filler: expected >= 1 and > 0, got {trials}, {per_filler}")
    rng = random.Random(seed)
    out = []
    for length in lengths:
        if length < PASSKEY_MIN_TOKENS:
            raise ValueError(f"--passkey-lengths: expected >= {PASSKEY_MIN_TOKENS} tokens, got {length}")
        groups = max(1, int((length - PASSKEY_MIN_TOKENS) / per_filler))
        for depth in depths:
            if not 0.0 <= depth <= 1.0:
                raise ValueError(f"--passkey-depths: expected fractions in [0, 1], got {depth}")
            for trial in range(trials):
                key = str(rng.randrange(10000, 100000))
                before = int(round(groups * depth))
                needle = f"\nThe pass key is {key}. Remember it. {key} is the pass key.\n"
                text = _HEAD + _FILLER * before + needle + _FILLER * (groups - before) + _TAIL
                out.append({"length": length, "depth": depth, "trial": trial, "key": key, "text": text})
    return out


def passkey_outcome(answer: dict, key: str) -> int:
    """1 when the server's ``/generate`` answer's text holds ``key``, else 0 (a failed request counts 0)."""
    text = answer.get("text")
    return int(isinstance(text, str) and key in text)


def run_passkey(base_url: str, prompts: list[dict], timeout: float = 1800.0) -> list[dict]:
    """Send every passkey prompt to ``base_url`` (greedy, 16 new tokens), one at a time.

    Returns:
        one dict per prompt: ``length``, ``depth``, ``trial``, ``prompt_tokens`` (as the server counted them, or
        None), ``answer`` (its text, or the error), ``correct`` (0 or 1).
    """
    out = []
    for p in prompts:
        ans = post_json(base_url + "/generate", {"text": p["text"],
                                                 "sampling_params": {"max_new_tokens": 16, "temperature": 0}}, timeout)
        meta = ans.get("meta_info") if isinstance(ans.get("meta_info"), dict) else {}
        out.append({"length": p["length"], "depth": p["depth"], "trial": p["trial"],
                    "prompt_tokens": meta.get("prompt_tokens"), "answer": ans.get("text", ans.get("error")),
                    "correct": passkey_outcome(ans, p["key"])})
    return out


def run_gsm8k(base_url: str, data_path: str, questions: int, workdir: str, *, answer_value, parallel: int = 64,
              run=subprocess.run) -> dict:
    """SGLang's few-shot GSM8K against ``base_url`` in ``workdir`` (its dump and output stay there), each question
    scored by ``answer_value`` (``gsm8k_outcomes``).

    Returns:
        dict: ``command``, ``accuracy_printed`` (SGLang's own ``Accuracy:`` line), ``outcomes`` (per question).

    Raises:
        RuntimeError: the run exits non-zero (the line of its output that says why, and its log's path).
    """
    cmd = gsm8k_command(base_url, data_path, questions, parallel=parallel)
    p = run(cmd, cwd=workdir, capture_output=True, text=True)
    log = os.path.join(workdir, "gsm8k_stdout.txt")
    with open(log, "w") as f:
        f.write(p.stdout + p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"few_shot_gsm8k exited with {p.returncode}: {client_error(p.stdout + p.stderr)} "
                           f"(log: {log})")
    m = re.search(r"^Accuracy: ([0-9.]+)", p.stdout, re.M)
    with open(os.path.join(workdir, GSM8K_DUMP)) as f:
        outcomes = gsm8k_outcomes(data_path, f.read(), questions, answer_value=answer_value)
    return {"command": cmd, "accuracy_printed": float(m.group(1)) if m else None, "outcomes": outcomes}
