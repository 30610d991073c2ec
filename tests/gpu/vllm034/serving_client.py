"""A small stdlib client for vLLM's OpenAI server on 127.0.0.1: a bounded burst, or a fixed-rate benchmark.

    python3 serving_client.py burst --port P [--api-key K] [--concurrency 64] [--max-s 120] [--out burst.json]
    python3 serving_client.py bench --port P [--api-key K] [--requests 200] [--rate 8] [--out bench.json]

Prompts are token ids (the server may run with ``--skip-tokenizer-init``), fixed by ``--seed``; every request asks
for ``--max-tokens`` tokens with ``ignore_eos`` so output lengths are fixed. ``burst`` keeps ``--concurrency``
requests in flight, prompts growing to ``--prompt-tokens``, until the server stops answering (the engine died)
or ``--max-s`` passed; ``--prompt-logprobs N`` asks for the logprobs of every prompt token (fp32 logits of the whole
prefill chunk, which vLLM's memory profiling does not size: a real way for serving to outgrow start-up); ``bench`` sends ``--requests`` at a constant ``--rate`` per second and writes output
throughput (tokens/s) and p50/p99 latency (s). Both write one JSON document. No dependency beyond Python.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
import urllib.error
import urllib.request


def _prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(10, vocab) for _ in range(n)]


def _request(args, prompt: list[int]) -> tuple[bool, float, int, str]:
    """(ok, latency s, output tokens, error text) of one completion."""
    body = {
        "model": args.model,
        "prompt": prompt,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    if args.prompt_logprobs is not None:  # logits of every prompt token: vLLM's profile_run never sizes this
        body["prompt_logprobs"] = args.prompt_logprobs
        body["return_tokens_as_token_ids"] = True  # the server may have no tokenizer
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    req = urllib.request.Request(
        f"http://127.0.0.1:{args.port}/v1/completions", data=json.dumps(body).encode(), headers=headers
    )
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=args.timeout) as resp:
            doc = json.loads(resp.read())
        tokens = int((doc.get("usage") or {}).get("completion_tokens") or args.max_tokens)
        return True, time.perf_counter() - t0, tokens, ""
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, time.perf_counter() - t0, 0, f"{type(exc).__name__}: {exc}"[:200]


def _model(args) -> str:
    if args.model:
        return args.model
    req = urllib.request.Request(f"http://127.0.0.1:{args.port}/v1/models")
    if args.api_key:
        req.add_header("Authorization", f"Bearer {args.api_key}")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())["data"][0]["id"]


def burst(args) -> dict:
    """Keep ``concurrency`` requests in flight until requests fail ``--fail-after`` times in a row or time is up."""
    rng = random.Random(args.seed)
    lock = threading.Lock()
    state = {"sent": 0, "ok": 0, "failed": 0, "in_a_row": 0, "errors": [], "stop": False}
    t_end = time.monotonic() + args.max_s

    def worker(i: int) -> None:
        while not state["stop"] and time.monotonic() < t_end:
            with lock:
                n = min(args.prompt_tokens, 16 + state["sent"] * args.grow)
                prompt = _prompt(rng, n, args.vocab)
                state["sent"] += 1
            ok, _, _, err = _request(args, prompt)
            with lock:
                if ok:
                    state["ok"] += 1
                    state["in_a_row"] = 0
                else:
                    state["failed"] += 1
                    state["in_a_row"] += 1
                    if len(state["errors"]) < 5:
                        state["errors"].append(err)
                    if state["in_a_row"] >= args.fail_after:
                        state["stop"] = True

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(args.concurrency)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, t_end - time.monotonic() + args.timeout))
    return {
        "mode": "burst",
        "seconds": round(time.monotonic() - t0, 2),
        "server_died": state["stop"],
        **{k: state[k] for k in ("sent", "ok", "failed", "errors")},
    }


def bench(args) -> dict:
    """``requests`` at a constant rate; output throughput and latency percentiles of the completed ones."""
    rng = random.Random(args.seed)
    prompts = [_prompt(rng, args.prompt_tokens, args.vocab) for _ in range(args.requests)]
    results: list[tuple[bool, float, int, str]] = [None] * args.requests  # type: ignore[list-item]

    def one(i: int) -> None:
        results[i] = _request(args, prompts[i])

    threads = []
    t0 = time.perf_counter()
    for i in range(args.requests):
        delay = t0 + i / args.rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        th = threading.Thread(target=one, args=(i,), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join(timeout=args.timeout)
    elapsed = time.perf_counter() - t0
    done = [r for r in results if r is not None and r[0]]
    lat = sorted(r[1] for r in done)

    def pct(p: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(p / 100 * len(lat)))], 4) if lat else None

    return {
        "mode": "bench",
        "requests": args.requests,
        "completed": len(done),
        "rate_per_s": args.rate,
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "seconds": round(elapsed, 3),
        "output_tokens": sum(r[2] for r in done),
        "output_tokens_per_s": round(sum(r[2] for r in done) / elapsed, 2) if elapsed else None,
        "latency_p50_s": pct(50),
        "latency_p99_s": pct(99),
        "errors": [r[3] for r in results if r is not None and not r[0]][:5],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=("burst", "bench"))
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--api-key", default="")
    p.add_argument("--model", default="", help="the served model's id (default: the first of /v1/models)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab", type=int, default=500, help="token ids are drawn below this")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--grow", type=int, default=64, help="burst: each request's prompt this many tokens longer")
    p.add_argument("--fail-after", type=int, default=8, help="burst: this many failures in a row: the engine died")
    p.add_argument("--max-s", type=float, default=120.0)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--rate", type=float, default=8.0)
    p.add_argument("--prompt-logprobs", type=int, default=None, help="ask each request's prompt logprobs (top N)")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    args.model = _model(args)
    doc = burst(args) if args.mode == "burst" else bench(args)
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
