"""Shared fixtures of the LLM tests: a tiny random Llama with LoRA, hand-written preference pairs, a small data
file of hand-written responses (:func:`small_data_file`), and the killing of a busy Dask worker
(:func:`kill_a_busy_worker`)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import time
from collections.abc import Callable, Sequence

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from llm_runs.model.generate import GenerationSettings  # noqa: E402
from llm_runs.model.models import add_lora, tiny_llama  # noqa: E402
from llm_runs.preferences.data import PreferencePair, score_and_write  # noqa: E402
from llm_runs.training.objectives import DPOSettings, PreferenceModel  # noqa: E402

PROMPTS = [
    ("p0", "Explain why the sky is blue."),
    ("p1", "List three fruits."),
]
RESPONSES = {
    "p0": ["Sunlight scatters off air molecules; blue light scatters most.", "Because it is.",
           "The sky looks blue because short wavelengths are scattered more strongly by the atmosphere."],
    "p1": ["Apple, banana, cherry.", "1. Mango\n2. Pear\n3. Plum", "Fruits are nice."],
}


def make_pairs(objective: str, order: tuple[tuple[int, int], ...]) -> list[PreferencePair]:
    """Pairs (chosen index, rejected index) on every prompt."""
    pairs = []
    for pid, prompt in PROMPTS:
        for c, r in order:
            pairs.append(PreferencePair(objective, pid, prompt, RESPONSES[pid][c], RESPONSES[pid][r], 1.0, c, r))
    return pairs


def tiny_preference_model(*, dtype=None, settings: DPOSettings | None = None, perturb: float = 0.05, seed: int = 0):
    """A float64 tiny Llama with LoRA whose B matrices are moved off 0 (so every LoRA matrix has a gradient)."""
    dtype = dtype or torch.float64
    model, tok = tiny_llama(seed=seed, dtype=dtype)
    peft_model = add_lora(model)
    pm = PreferenceModel(peft_model, tok, settings or DPOSettings(max_response_tokens=24))
    if perturb:
        gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for p in pm.params:
                p.add_(perturb * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return pm


#: Two prompts with four hand-written responses each, as the generation step records them (a small data file).
RECORDS = [
    {
        "id": "explain-00",
        "prompt": "Explain why the sky is blue.",
        "call": 0,
        "call_seconds": 1.0,
        "responses": [
            {"text": "Air scatters blue light more than red light, so the sky looks blue.", "n_tokens": 15,
             "finished": True, "cut_off": None},
            {"text": "Blue.", "n_tokens": 2, "finished": True, "cut_off": None},
            {"text": "The sky is blue because sunlight is scattered by the molecules of the atmosphere; short "
                     "wavelengths such as blue and violet scatter much more strongly than long ones, and our eyes "
                     "are more sensitive to blue.", "n_tokens": 40, "finished": True, "cut_off": None},
            {"text": "I hate this terrible question. Awful.", "n_tokens": 9, "finished": True, "cut_off": None},
        ],
    },
    {
        "id": "list-00",
        "prompt": "List three fruits.",
        "call": 0,
        "call_seconds": 1.0,
        "responses": [
            {"text": "Apple, banana and cherry are wonderful fruits!", "n_tokens": 10, "finished": True,
             "cut_off": None},
            {"text": "1. Mango\n2. Pear\n3. Plum", "n_tokens": 12, "finished": True, "cut_off": None},
            {"text": "Fruits fruits fruits fruits fruits fruits fruits fruits.", "n_tokens": 12, "finished": False,
             "cut_off": "length"},
            {"text": "Cars are fast machines with engines and wheels.", "n_tokens": 10, "finished": True,
             "cut_off": None},
        ],
    },
]
SETTINGS = GenerationSettings(responses_per_prompt=4, max_new_tokens=40)
MODEL = {"name": "test-model", "source": "hand-written"}


def small_data_file(path):
    """:data:`RECORDS` scored by every reward and written as a data file at ``path`` (returned)."""
    return score_and_write(RECORDS, SETTINGS, MODEL, path, progress=False)


def run_cli(*args: str) -> tuple[int, str]:
    """``python -m llm_runs ARGS`` in this process, without the malloc re-exec (it would replace the test process):
    the exit status and what it printed on stdout."""
    from llm_runs.__main__ import main

    buf = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(buf):
        mp.setenv("PREFALIGN_NO_REEXEC", "1")
        code = main(list(args))
    return code, buf.getvalue()


def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama (float32) saved as a model directory (a module fixture's body)."""
    from llm_runs.model.models import save_random_llama

    return save_random_llama(tmp_path_factory.mktemp("model") / "tiny", "tiny", dtype="float32")[0]


def kill_a_busy_worker(client, killed: dict, *, ready: Callable[[dict], bool] = bool, settle: float = 0.0,
                       timeout: float = 600.0, poll: float = 0.1) -> None:
    """Once ``ready(busy)`` holds (``busy``: each address of a worker of ``client``'s cluster that is running a cell
    -> the keys of its cells), wait ``settle`` seconds and SIGKILL the process of one of those workers (its nanny
    starts a new one; the scheduler hands the cell to a worker again); ``killed`` gets its ``addr``, ``keys``,
    ``pid`` and the time ``at``. Gives up after ``timeout`` seconds (``killed`` stays empty). The body of a killer
    thread of the e2e tests."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not killed:
        busy = {w: keys for w, keys in client.processing().items() if keys}
        if busy and ready(busy):
            time.sleep(settle)
            addr, keys = next(iter(busy.items()))
            pid = client.run(os.getpid, workers=[addr])[addr]
            os.kill(pid, signal.SIGKILL)
            killed.update(addr=addr, keys=list(keys), pid=pid, at=time.time())
            return
        time.sleep(poll)


def runs_running(out, seeds: Sequence[int]) -> Callable[[dict], bool]:
    """A ``ready`` of :func:`kill_a_busy_worker` for an LLM sweep into ``out``: every seed's run directory holds the
    summary of a run under way (the model loaded, the run started)."""
    from llm_runs.sweeps.sweep import run_dir

    def ready(busy: dict) -> bool:
        started = []
        for s in seeds:
            try:
                started.append(json.loads((run_dir(out, s) / "summary.json").read_text())["status"])
            except (OSError, ValueError, KeyError):
                pass
        return started == ["running"] * len(seeds)

    return ready
