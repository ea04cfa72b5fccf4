"""Benchmark a rag knowledge base: build, query latency, HNSW recall vs exact search.

Builds a knowledge base of synthetic but varied text (topic words mixed with a
Zipf-distributed general vocabulary) through the public API with the offline
``local:hash-384`` embedder, then measures

- hybrid query latency (embed + HNSW + BM25 + fusion), target p50 <= 20 ms;
- HNSW recall@10 against exact brute-force cosine search over the same vectors
  in the same run, target >= 0.98; and the HNSW speed-up over brute force.

Usage: ``python bench/rag_bench.py [--quick]``. Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

P50_TARGET_MS = 20.0
RECALL_TARGET = 0.98
SEED = 20240611
CHUNK_SIZE = 700


def _vocabulary(rng: random.Random, size: int) -> list[str]:
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["qu", "th", "sh", "ch"]
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def write_corpus(root: Path, chunks: int, rng: random.Random) -> list[list[str]]:
    """Write ``chunks`` paragraphs into files of 10; return each topic's words."""
    vocab = _vocabulary(rng, 6000)
    general, topical = vocab[:3000], vocab[3000:]
    topics = [topical[i * 30 : (i + 1) * 30] for i in range(100)]
    weights = [1.0 / (rank + 1) for rank in range(len(general))]  # Zipf
    per_file = 10
    for f in range(0, chunks, per_file):
        paragraphs = []
        while len(paragraphs) < min(per_file, chunks - f):
            topic = rng.choice(topics)
            n = rng.randint(50, 90)
            words = rng.choices(general, weights=weights, k=n - n // 4)
            words += rng.choices(topic, k=n // 4)
            rng.shuffle(words)
            text = " ".join(words).capitalize() + "."
            # Between half and all of CHUNK_SIZE: each paragraph is exactly one chunk.
            if CHUNK_SIZE // 2 + 10 < len(text) < CHUNK_SIZE:
                paragraphs.append(text)
        (root / "corpus" / f"doc{f // per_file:05d}.txt").write_text("\n\n".join(paragraphs))
    return topics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, same checks (CI)")
    args = parser.parse_args(argv)
    n_chunks, n_queries = (2000, 100) if args.quick else (10_000, 300)

    import numpy as np

    from graphrun.actors.rag.retrieval import KbConfig, load_or_build

    rng = random.Random(SEED)
    with tempfile.TemporaryDirectory() as tmp:
        agent_dir = Path(tmp)
        (agent_dir / "corpus").mkdir()
        topics = write_corpus(agent_dir, n_chunks, rng)
        cfg = KbConfig(
            documents=["./corpus/"],
            embedding_model="local:hash-384",
            chunk_size=CHUNK_SIZE,
            chunk_overlap=50,
        )
        t0 = time.perf_counter()
        load_or_build(agent_dir, "bench", cfg, interactive=False, ask=None, rag_defaults={})
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        kb = load_or_build(agent_dir, "bench", cfg, interactive=False, ask=None, rag_defaults={})
        load_s = time.perf_counter() - t0

        queries = []
        for _ in range(n_queries):
            topic = rng.choice(topics)
            queries.append(" ".join(rng.sample(topic, 3) + rng.sample(topic, 2)))
        kb.query(queries[0])  # warm caches (embedder word cache, numpy paths)
        latencies = []
        for q in queries:
            t0 = time.perf_counter()
            kb.query(q, top_k=5)
            latencies.append((time.perf_counter() - t0) * 1000)

        vectors = kb.vectors
        qvecs = kb.embedder.embed(queries)
        hnsw_ms, exact_ms, found = [], [], 0
        for qv in qvecs:
            t0 = time.perf_counter()
            approx = {i for i, _ in kb.index.vector_search(qv, 10)}
            hnsw_ms.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            sims = vectors @ qv
            exact = np.argpartition(-sims, 10)[:10]
            exact_ms.append((time.perf_counter() - t0) * 1000)
            found += len(approx & {int(i) for i in exact})
        recall = found / (10 * len(qvecs))

    p50 = statistics.median(latencies)
    p95 = sorted(latencies)[int(0.95 * len(latencies)) - 1]
    speedup = statistics.median(exact_ms) / statistics.median(hnsw_ms)
    rows = [
        ("chunks", f"{len(kb)}", ""),
        ("build (load, chunk, embed, index, save)", f"{build_s:.2f} s", ""),
        ("load existing knowledge base", f"{load_s * 1000:.0f} ms", ""),
        ("hybrid query p50", f"{p50:.2f} ms", f"<= {P50_TARGET_MS:.0f} ms"),
        ("hybrid query p95", f"{p95:.2f} ms", ""),
        ("HNSW recall@10 vs exact", f"{recall:.4f}", f">= {RECALL_TARGET}"),
        ("HNSW speed-up vs exact search", f"{speedup:.1f}x", ""),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"rag_bench ({'quick' if args.quick else 'full'}, {n_queries} queries)")
    for name, value, target in rows:
        print(f"  {name:<{width}}  {value:>10}  {target}")
    failed = []
    if p50 > P50_TARGET_MS:
        failed.append(f"query p50 {p50:.2f} ms > {P50_TARGET_MS} ms")
    if recall < RECALL_TARGET:
        failed.append(f"recall@10 {recall:.4f} < {RECALL_TARGET}")
    for problem in failed:
        print(f"FAIL: {problem}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
