"""Whether llama.cpp computes a prompt to the same bits however it is split into batches.

kvdesk keeps what a context already holds of a request and computes only the rest, so a
prompt is split where the held part ends: a resend, a conversation's next turn, a prompt
sharing a header with the one before. This measures, on the CPU build kvdesk pins, the last
token's logits of one prompt computed whole and computed in two batches split at several
places (and with the last token alone), with flash attention on and off, and what each costs
in prefill speed.

    .venv/bin/python -m benchmarks.bench_split_numerics [--model PATH] [--tokens 1024]
"""

from __future__ import annotations

import argparse
import os
import random
import time

import llama_cpp
import numpy as np

from desktop_app.model.models import default_model_path


def _logits(llm: llama_cpp.Llama) -> np.ndarray:
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()


def _computed(llm: llama_cpp.Llama, tokens: list[int], at: list[int]) -> np.ndarray:
    llm._ctx.kv_cache_seq_rm(-1, 0, -1)
    llm.n_tokens = 0
    for start, end in zip([0, *at], [*at, len(tokens)], strict=True):
        llm.eval(tokens[start:end])
    return _logits(llm)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(default_model_path()))
    p.add_argument("--tokens", type=int, default=1024, help="the prompt for prefill speed")
    args = p.parse_args()
    words = "alpha beta gamma delta river stone cloud lamp paper".split()
    rng = random.Random(1)
    for flash in (False, True):
        llm = llama_cpp.Llama(model_path=args.model, n_ctx=8192, n_batch=512, n_threads=2,
                              flash_attn=flash, verbose=False)
        prompt = llm.tokenize(("Your secret name is TARQUIN. " + " ".join(
            rng.choice(words) for _ in range(60)) + " What is your secret name?").encode())
        n = len(prompt)
        whole = _computed(llm, prompt, [])
        for at in ([3], [n // 2], [n - 2], [n - 1], [n - 2, n - 1]):
            got = _computed(llm, prompt, at)
            print(f"flash_attn={flash!s:5} split at {at}: max |logit diff| "
                  f"{float(np.abs(got - whole).max()):.4f}, same greedy token "
                  f"{int(got.argmax()) == int(whole.argmax())}", flush=True)
        long = [rng.randrange(1000, 20000) for _ in range(args.tokens)]
        t0 = time.perf_counter()
        _computed(llm, long, list(range(128, args.tokens, 128)))
        print(f"flash_attn={flash!s:5} prefill {args.tokens / (time.perf_counter() - t0):.0f} "
              f"tokens/s (load {os.getloadavg()[0]:.1f})", flush=True)
        del llm


if __name__ == "__main__":
    main()
