"""python -m bench {engine,speculative,matmul,dspark,dspark-head,dspark-sources,lattice,lossy,app,load,
trace_load,distill-gen,serve,serve-soak,all}: run benchmarks and write their sections of BENCHMARKS.md."""
import sys

from bench import (
    app,
    distill_gen,
    dspark,
    dspark_head,
    dspark_sources,
    engine,
    lattice,
    load,
    lossy,
    matmul,
    serve,
    serve_soak,
    speculative,
    trace_load,
)

BENCHES = {"engine": engine.main, "speculative": speculative.main, "matmul": matmul.main, "dspark": dspark.main,
           "dspark-head": dspark_head.main, "dspark-sources": dspark_sources.main,
           "lattice": lattice.main, "lossy": lossy.main, "app": app.main, "load": load.main,
           "trace_load": trace_load.main, "distill-gen": distill_gen.main,
           "serve": serve.main, "serve-soak": serve_soak.main}


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in (*BENCHES, "all"):
        sys.exit(f"usage: python -m bench {{{','.join(BENCHES)},all}} [options]")
    names = list(BENCHES) if argv[0] == "all" else [argv[0]]
    for name in names:
        BENCHES[name](argv[1:] if argv[0] != "all" else [])


if __name__ == "__main__":
    main(sys.argv[1:])
