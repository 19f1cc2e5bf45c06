"""The trace loader checks the whole structure: every cross-reference a step holds (beam sources, tree
parents and depths, DP and accepted paths, γ tables, index fields), strings that are valid Unicode,
sizes within the named limits, and one step kind per strategy; each refusal is one line naming the
field's path. It builds each class's field plan once, so its work grows with the trace's size only.
Mutations of real recorded traces (tests/golden) stand in for hand-edited or adversarial uploads."""
from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import typing
from collections import Counter
from pathlib import Path

import pytest

from decoding.core import trace
from decoding.core.config import DSPARK_MAX_BUDGET, MAX_TOP_N
from decoding.core.trace import TraceFormatError, from_json

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"


def golden(name: str) -> dict:
    return json.loads((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))


def refused(data: dict | str, field: str) -> str:
    """The one-line refusal of `data`, which must name `field` (a path, e.g. 'trace.steps[2].nodes[0].depth')."""
    text = data if isinstance(data, str) else json.dumps(data)
    with pytest.raises(TraceFormatError) as err:
        from_json(text)
    message = str(err.value)
    assert field in message, message
    assert "\n" not in message and len(message) < 400, message
    message.encode("utf-8")          # shown as is: no lone surrogate of the input leaks into it
    return message


def shipped_traces() -> list[tuple[str, str]]:
    """(name, JSON text) of every trace the repository ships: the golden traces (lockstep.json holds
    several) and the tour's traces under assets/."""
    names = subprocess.run(["git", "ls-files", "*.json"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    out = []
    for name in names:
        data = json.loads((ROOT / name).read_text(encoding="utf-8"))
        if isinstance(data, list):                           # a list of traces (not other shipped JSON lists)
            out += [(f"{name}[{i}]", json.dumps(t)) for i, t in enumerate(data) if isinstance(t, dict) and "steps" in t]
        elif isinstance(data, dict) and "steps" in data:
            out.append((name, (ROOT / name).read_text(encoding="utf-8")))
    return out


# ---------------------------------------------------------------- what must keep loading

def test_every_shipped_trace_loads():
    traces = shipped_traces()
    strategies = {json.loads(text)["strategy"] for _, text in traces}
    assert len(traces) >= 30 and strategies == {"greedy", "sample", "beam", "speculative", "dspark"}
    assert any(name.startswith("assets/") for name, _ in traces)
    for name, text in traces:
        assert from_json(text).steps, name


def _as_version_1_0(data: dict) -> dict:
    """The trace as schema 1.0 wrote it: without the fields 1.1 (DSpark lookup), 1.2 (γ choice), 1.3 (kv,
    target entropy), 1.4 (a size's round overhead), 1.5 (lattice sources) and 1.6 (speculative drafting) added
    (a trace that carries one is refused: test_a_field_newer_than_the_version_is_refused)."""
    data["schema_version"] = "1.0"
    for step in data["steps"]:
        for key in ("lookup", "lookup_scores", "gamma_choice", "kv", "drafting"):
            step.pop(key, None)
        if step.get("size"):
            step["size"].pop("overhead_ms")                  # added in 1.4
        for column in step.get("lattice", []):
            for cell in column["cells"]:
                cell.pop("lookup"), cell.pop("sources", None)
        for item in step.get("nodes", []) + step.get("drafts", []):
            item.pop("lookup", None), item.pop("sources", None), item.pop("target_entropy", None)
    return data


@pytest.mark.parametrize("value", [-5.0, -1e-9])
def test_negative_round_overhead_is_refused(value):
    data = golden("dspark_lookup_cost")
    sized = next(step for step in data["steps"] if step.get("size"))
    sized["size"]["overhead_ms"] = value
    with pytest.raises(TraceFormatError, match=r"size\.overhead_ms.*is not a duration"):
        from_json(json.dumps(data))
    sized["size"]["overhead_ms"] = 0.5                           # control: a duration loads
    assert from_json(json.dumps(data)).steps


@pytest.mark.parametrize("name", ["dspark_lookup_cost", "spec_cost", "beam", "sample"])
def test_older_minor_version_loads(name):
    back = from_json(json.dumps(_as_version_1_0(golden(name))))
    assert back.schema_version == "1.0" and len(back.steps) == len(golden(name)["steps"])


def _as_version_1_4(data: dict) -> dict:
    """The trace as schema 1.4 wrote it: a lattice cell and a plan node say only whether prompt lookup
    proposed them (`lookup`), with no `sources`, and a round no `drafting` (all added in 1.5)."""
    data["schema_version"] = "1.4"
    for step in data["steps"]:
        step.pop("drafting", None)
        for item in [c for column in step.get("lattice", []) for c in column["cells"]] + step.get("nodes", []):
            item.pop("sources")
    return data


def test_lookup_cells_of_an_older_minor_read_as_source_lookup():
    recorded = golden("dspark_lookup_cost")          # prompt lookup and the parallel drafter in one lattice
    back = from_json(json.dumps(_as_version_1_4(golden("dspark_lookup_cost"))))
    rounds = [s for s in back.steps if s.kind == "dspark_round"]
    cells = [c for s in rounds for column in s.lattice for c in column.cells]
    items = cells + [n for s in rounds for n in s.nodes]
    assert back.schema_version == "1.4" and all(not item.sources for item in items)
    assert all(s.drafting is None for s in rounds)
    assert {item.lookup for item in cells} == {True, False}       # both kinds are there to read
    assert all(trace.proposed_by(item) == (("lookup",) if item.lookup else ("drafter",)) for item in items)
    kept = [c for s in recorded["steps"] if s.get("kind") == "dspark_round" for col in s["lattice"]
            for c in col["cells"]]
    assert [c["lookup"] for c in kept] == [c.lookup for c in cells]


# ---------------------------------------------------------------- beam search

@pytest.mark.parametrize("step,field,value", [
    (3, "source_beam", -1),          # negative
    (3, "source_beam", 3),           # the previous step had 3 live beams
    (0, "source_beam", 3),           # step 0: the search's 3 rows
])
def test_beam_source_out_of_range_refused(step, field, value):
    data = golden("beam")
    data["steps"][step]["pool"][1][field] = value
    refused(data, f"trace.steps[{step}].pool[1].source_beam={value}")


@pytest.mark.parametrize("value", [-2, 3, 10**6])
def test_live_beam_parent_out_of_range_refused(value):
    data = golden("beam")
    data["steps"][5]["beams"][0]["parent"] = value
    refused(data, f"trace.steps[5].beams[0].parent={value}")


def test_beam_live_beams_must_be_the_kept_candidates():
    data = golden("beam")
    data["steps"][4]["beams"].pop()
    refused(data, "trace.steps[4].beams")


def test_beam_hypothesis_from_a_later_step_refused():
    data = golden("beam")
    data["steps"][19]["finished"][0]["step"] = 20
    refused(data, "trace.steps[19].finished[0].step=20")


def test_num_beams_over_the_limit_refused():
    data = golden("beam")
    data["steps"][0]["num_beams"] = trace.MAX_BEAMS + 1
    refused(data, "trace.steps[0].num_beams=33")


# ---------------------------------------------------------------- dspark

def _dspark(name: str = "dspark_tree") -> dict:
    return golden(name)


@pytest.mark.parametrize("mutate,field", [
    (lambda s: s["accepted_path"].append(11), "trace.steps[7].accepted_path[2]=11"),       # no node 11
    (lambda s: s["accepted_path"].__setitem__(0, 0), "trace.steps[7].accepted_path[0]=0"),  # the root
    (lambda s: s["accepted_path"].__setitem__(1, 6), "trace.steps[7].accepted_path[1]=6"),  # not a child of 1
    (lambda s: s["accepted_path"].__setitem__(0, 6), "trace.steps[7].accepted_path[0]=6"),  # not accepted
])
def test_dspark_accepted_path_to_missing_or_wrong_node_refused(mutate, field):
    data = _dspark()
    mutate(data["steps"][7])
    refused(data, field)


@pytest.mark.parametrize("parent", [5, 9, -1, 100])
def test_dspark_node_parent_not_an_earlier_node_refused(parent):
    data = _dspark()
    data["steps"][1]["nodes"][4]["parent"] = parent       # node 5
    refused(data, f"trace.steps[1].nodes[4].parent={parent}")


@pytest.mark.parametrize("depth", [2, 4, 1_000_000])
def test_dspark_node_depth_not_parent_plus_one_refused(depth):
    data = _dspark()
    data["steps"][1]["nodes"][2]["depth"] = depth         # node 3: parent 2 at depth 2
    refused(data, f"trace.steps[1].nodes[2].depth={depth}")


def test_dspark_node_deeper_than_gamma_refused():
    """A chain one node longer than the lattice: depth 7 at γ = 6 (the 33-second render of issue 28)."""
    data = _dspark()
    nodes = data["steps"][1]["nodes"]
    nodes.append({**nodes[-1], "node": 11, "parent": 10, "depth": 7})
    refused(data, "trace.steps[1].nodes[10].depth=7")


@pytest.mark.parametrize("mutate,field", [
    (lambda n: n.update(cand=3), "trace.steps[1].nodes[0].cand=3"),              # 3 candidates per position
    (lambda n: n.update(cand=-1), "trace.steps[1].nodes[0].cand=-1"),
    (lambda n: n.update(token_id=0), "trace.steps[1].nodes[0].token_id=0"),      # not the cell's token
    (lambda n: n.update(node=2), "trace.steps[1].nodes[0].node=2"),
])
def test_dspark_node_not_its_lattice_cell_refused(mutate, field):
    data = _dspark()
    mutate(data["steps"][1]["nodes"][0])
    refused(data, field)


@pytest.mark.parametrize("mutate,field", [
    (lambda dp: dp["path"].__setitem__(3, 2), "trace.steps[1].dp.path[3]=2"),           # K = 2 candidates
    (lambda dp: dp["path"].__setitem__(0, -1), "trace.steps[1].dp.path[0]=-1"),
    (lambda dp: dp["path"].pop(), "trace.steps[1].dp.path"),
    (lambda dp: dp["back"][0].__setitem__(1, 5), "trace.steps[1].dp.back[0][1]=5"),
    (lambda dp: dp["back"][0].__setitem__(1, None), "trace.steps[1].dp.back[0][1]=None"),
    (lambda dp: dp["back"][-1].__setitem__(0, 0), "trace.steps[1].dp.back[7][0]=0"),
    (lambda dp: dp["values"][2].pop(), "trace.steps[1].dp.values[2]"),
    (lambda dp: [dp[k].append(dp[k][-1]) for k in ("values", "back", "path")], "trace.steps[1].dp.values"),
])
def test_dspark_dp_path_to_missing_cell_refused(mutate, field):
    data = _dspark("dspark_chain")
    mutate(data["steps"][1]["dp"])
    refused(data, field)


@pytest.mark.parametrize("mutate,field", [
    (lambda c: c[1]["cells"][0].update(cand=1), "trace.steps[1].lattice[1].cells[0].cand=1"),
    (lambda c: c[1]["cells"][0].update(position=3), "trace.steps[1].lattice[1].cells[0].position=3"),
    (lambda c: c[2].update(position=2), "trace.steps[1].lattice[2].position=2"),
    (lambda c: c[1]["cells"][2].update(scores=[0.5]), "trace.steps[1].lattice[1].cells[2].scores"),
    (lambda c: c[0].update(confidence=[]), "trace.steps[1].lattice[0].confidence"),
    (lambda c: c[3].update(cells=[]), "trace.steps[1].lattice[3].cells"),
    (lambda c: c[1]["cells"][1].update(token_id=c[1]["cells"][0]["token_id"]),
     "trace.steps[1].lattice[1].cells[1].token_id"),
    (lambda c: c.extend(c[-1:] * 11), "trace.steps[1].lattice"),                 # 17 positions > DSPARK_MAX_GAMMA
])
def test_dspark_lattice_cross_references_refused(mutate, field):
    data = _dspark()
    mutate(data["steps"][1]["lattice"])
    refused(data, field)


@pytest.mark.parametrize("mutate,field", [
    (lambda s: s["size"].update(size=0), "trace.steps[2].size.size=0"),
    (lambda s: s["size"].update(size=9), "trace.steps[2].size.size=9"),
    (lambda s: s["size"]["tokens_per_s"].pop(), "trace.steps[2].size.tokens_per_s"),
    (lambda s: s.update(lookup_scores=[0.5, 0.5, 0.5]), "trace.steps[2].lookup_scores"),
    (lambda s: s["lookup"].update(ngram=list(range(17))), "trace.steps[2].lookup.ngram"),
    (lambda s: s.update(emitted=s["emitted"] * 2), "trace.steps[2].emitted"),
])
def test_dspark_round_tables_refused(mutate, field):
    data = _dspark("dspark_lookup_cost")
    mutate(data["steps"][2])
    refused(data, field)


def test_dspark_nodes_over_the_budget_refused():
    data = _dspark()
    step = data["steps"][1]
    step["nodes"] = [{**step["nodes"][0], "node": i + 1} for i in range(DSPARK_MAX_BUDGET + 1)]
    refused(data, "trace.steps[1].nodes")


# ---------------------------------------------------------------- speculative

@pytest.mark.parametrize("mutate,field", [
    (lambda s: s["drafts"][1].update(index=0), "trace.steps[0].drafts[1].index=0"),
    (lambda s: s.update(gamma=4), "trace.steps[0].gamma=4"),                     # 3 drafts recorded
    (lambda s: s.update(gamma=10**9), "trace.steps[0].gamma=1000000000"),
    (lambda s: s.update(gamma=-1), "trace.steps[0].gamma=-1"),
    (lambda s: s.update(accepted=3, gamma=2), "trace.steps[0].accepted=3"),
    (lambda s: s.update(accepted=-1), "trace.steps[0].accepted=-1"),
    (lambda s: s.update(emitted=[1, 2, 3, 4, 5]), "trace.steps[0].emitted"),
    (lambda s: s["gamma_choice"].update(gamma=0), "trace.steps[0].gamma_choice.gamma=0"),
    (lambda s: s["gamma_choice"]["verify_ms"].pop(), "trace.steps[0].gamma_choice.verify_ms"),
    (lambda s: s["gamma_choice"]["acceptance"].pop(), "trace.steps[0].gamma_choice.acceptance"),
    (lambda s: s["gamma_choice"].update(expected_tokens=[]), "trace.steps[0].gamma_choice.expected_tokens"),
    (lambda s: s["lookup"].update(ngram=list(range(17))), "trace.steps[0].lookup.ngram"),
    (lambda s: s.update(drafts=s["drafts"] * 11), "trace.steps[0].drafts"),     # 33 > SPEC_MAX_GAMMA
    (lambda s: s.update(residual_top=[{"token_id": 1, "piece": "a", "prob": 0.1}] * (MAX_TOP_N + 1)),
     "trace.steps[0].residual_top"),
])
def test_spec_round_cross_references_refused(mutate, field):
    data = golden("spec_cost")
    mutate(data["steps"][0])
    refused(data, field)


# ---------------------------------------------------------------- greedy and sampling

@pytest.mark.parametrize("mutate,field", [
    (lambda s: s.update(raw_top=[], processed_top=[]), "trace.steps[2].raw_top"),
    (lambda s: s["processed_top"].pop(), "trace.steps[2].processed_top"),
    (lambda s: s["processed_top"][1].update(token_id=s["raw_top"][0]["token_id"]),
     "trace.steps[2].processed_top[1].token_id"),
    (lambda s: (s["raw_top"].reverse(), s["processed_top"].reverse()), "trace.steps[2].raw_top[1].logit"),
    (lambda s: s["processed_top"][3].update(prob=2.0), "trace.steps[2].processed_top[3].prob=2.0"),
    (lambda s: s["filters"][0].update(value=0.0), "trace.steps[2].filters[0].value=0.0"),
    (lambda s: s.update(raw_top=s["raw_top"][:1] * 101, processed_top=s["processed_top"][:1] * 101),
     "trace.steps[2].raw_top: 101 candidates is over the limit of 100"),
])
def test_token_step_candidates_refused(mutate, field):
    data = golden("sample")
    assert data["steps"][2]["filters"][0]["name"] == "temperature"
    mutate(data["steps"][2])
    refused(data, field)


# ---------------------------------------------------------------- every kind: index, kind, timings

@pytest.mark.parametrize("name", ["sample", "beam", "spec_cost", "dspark_tree"])
def test_step_index_not_its_place_refused(name):
    data = golden(name)
    data["steps"][2]["index"] = 7
    refused(data, "trace.steps[2].index=7")


@pytest.mark.parametrize("kind", [[], {}, ["token"], {"a": 1}])
def test_unhashable_step_kind_refused(kind):
    data = golden("sample")
    data["steps"][1]["kind"] = kind
    assert "unknown step kind" in refused(data, "trace.steps[1]")


def test_step_of_another_strategy_refused():
    data = golden("sample")
    data["steps"][3] = golden("beam")["steps"][3]
    refused(data, "trace.steps[3].kind='beam'")
    data = golden("sample")
    data["strategy"] = "mystery"
    refused(data, "trace.strategy='mystery'")


@pytest.mark.parametrize("value", [-1.0, None])
def test_timing_not_a_duration_refused(value):
    data = golden("dspark_tree")
    data["steps"][1]["timings_ms"]["drafter"] = value
    refused(data, f"trace.steps[1].timings_ms.drafter={value}")


# ---------------------------------------------------------------- values: Unicode, numbers

def _set_path(data: dict, path: tuple, value) -> None:
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


@pytest.mark.parametrize("path,field", [
    (("steps", 1, "raw_top", 0, "piece"), "trace.steps[1].raw_top[0].piece="),
    (("prompt_text",), "trace.prompt_text="),
    (("steps", 0, "chosen_piece"), "trace.steps[0].chosen_piece="),
    (("config", "note"), "trace.config.note="),
    (("model", "name"), "trace.model.name="),
])
@pytest.mark.parametrize("bad", ["\ud800", "ok \udfff then", "\udc80" * 3])
def test_lone_surrogate_refused(path, field, bad):
    data = golden("sample")
    _set_path(data, path, bad)
    text = json.dumps(data)            # ASCII, with the surrogate as a \\u escape: valid JSON
    assert "\\ud" in text
    assert "lone surrogate" in refused(text, field)


def test_lone_surrogate_in_a_key_refused():
    data = golden("sample")
    data["steps"][0]["timings_ms"]["\ud800"] = 1.0
    refused(data, "trace.steps[0].timings_ms")


def test_a_valid_surrogate_pair_loads():
    data = golden("sample")
    data["steps"][1]["raw_top"][0]["piece"] = "😀"
    assert from_json(json.dumps(data)).steps[1].raw_top[0].piece == "😀"       # written as \ud83d\ude00


@pytest.mark.parametrize("literal", ["NaN", "Infinity"])
def test_non_finite_number_refused(literal):
    """Python's json reads NaN and Infinity; a trace stores -inf only (as null)."""
    text = re.sub(r'"entropy_raw": [-0-9.e]+', f'"entropy_raw": {literal}', json.dumps(golden("sample")), count=1)
    refused(text, f"trace.steps[0].entropy_raw={literal.lower()[:3]}")


@pytest.mark.parametrize("value", [1e301, -1e308, 10**400])
def test_float_beyond_the_magnitude_limit_refused(value):
    """Values near the float limit overflow where the views add or subtract them (an axis's span)."""
    data = golden("spec_cost")
    data["steps"][1]["final_top"][1]["prob"] = value
    refused(data, "trace.steps[1].final_top[1].prob=")


def test_null_only_where_minus_infinity_is_a_value():
    data = golden("spec_cost")
    data["steps"][1]["final_top"][1]["prob"] = None             # a probability: no
    assert "only logits" in refused(data, "trace.steps[1].final_top[1].prob=None")
    data = golden("spec_cost")
    data["steps"][1]["final_top"][1]["logit"] = None            # a removed token's logit: yes
    assert from_json(json.dumps(data)).steps[1].final_top[1].logit == -math.inf


@pytest.mark.parametrize("field", ["chosen_logprob", "chosen_raw_logprob"])
def test_log_probability_above_zero_refused(field):
    data = golden("sample")
    data["steps"][4][field] = 800.0                             # exp() of it overflows in the chips
    refused(data, f"trace.steps[4].{field}=800.0")


def test_integer_of_too_many_digits_refused():
    text = json.dumps(golden("sample")).replace('"index": 1,', '"index": ' + "9" * 5000 + ",", 1)
    assert "not valid JSON" in refused(text, "")


def test_integer_beyond_64_bits_refused():
    data = golden("sample")
    data["steps"][0]["position"] = 2**64
    refused(data, "trace.steps[0].position=18446744073709551616")


# ---------------------------------------------------------------- sizes

def test_steps_over_the_limit_refused(monkeypatch):
    monkeypatch.setattr(trace, "MAX_STEPS", 5)
    data = golden("sample")
    assert len(data["steps"]) > 5
    assert "5 step limit" in refused(data, "trace.steps")


def test_string_over_the_limit_refused():
    data = golden("sample")
    data["steps"][0]["raw_top"][0]["piece"] = "x" * (trace.MAX_LABEL_CHARS + 1)
    refused(data, "trace.steps[0].raw_top[0].piece")
    data = golden("sample")
    data["text"] = "x" * (trace.MAX_LABEL_CHARS + 1)          # long text is fine in the text fields
    assert from_json(json.dumps(data)).text == data["text"]


def test_list_over_the_limit_refused():
    data = golden("dspark_lookup_cost")
    data["steps"][2]["size"]["verify_ms"] = [1.0] * (trace.MAX_LIST_ITEMS + 1)
    refused(data, "trace.steps[2].size.verify_ms")


# ---------------------------------------------------------------- work grows with the size only

def _repeated(data: dict, times: int) -> dict:
    """The trace with its steps repeated `times` times (renumbered; output and counts recomputed; a speculative
    run's `drafting` stays on its first round only)."""
    small = from_json(json.dumps(data))
    body = small.steps

    def copy(i: int):
        step = body[i % len(body)]
        later = i >= len(body) and step.kind == "spec_round"
        return dataclasses.replace(step, index=i, **({"drafting": None} if later else {}))

    steps = tuple(copy(i) for i in range(times * len(body)))
    return trace.to_dict(trace.recounted(dataclasses.replace(small, steps=steps)))


@pytest.mark.slow
def test_type_hints_once_per_class(monkeypatch):
    """typing.get_type_hints runs once per dataclass, however many steps a trace holds (it took most of
    the 55 s a 44 MB trace needed before)."""
    real = typing.get_type_hints
    calls: Counter = Counter()

    def counting(cls, *args, **kwargs):
        calls[cls] += 1
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(typing, "get_type_hints", counting)
    trace._plan.cache_clear()
    trace._converter.cache_clear()
    for name in ("sample", "beam", "spec_cost", "dspark_lookup_cost"):
        from_json(json.dumps(_repeated(golden(name), 1)))
    first = sum(calls.values())
    for name in ("sample", "spec_cost", "dspark_lookup_cost"):
        from_json(json.dumps(_repeated(golden(name), 20)))
    assert calls and max(calls.values()) == 1, calls
    assert sum(calls.values()) == first


# ---------------------------------------------------------------- contradictions (issue 39)
# Traces whose fields are well typed but contradict the views' closed sets or the trace's own steps.

def _dotted(path: tuple) -> str:
    return "trace" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


CLOSED_FIELDS = [               # (golden trace, path to a closed-set field, its class's set)
    ("sample", ("stop_reason",), trace.STOP_REASONS),
    ("sample", ("steps", 2, "processed_top", 1, "removed_by"), trace.FILTER_NAMES),
    ("sample", ("steps", 2, "filters", 1, "name"), trace.FILTER_NAMES),
    ("beam", ("steps", 1, "pool", 0, "status"), trace.BEAM_STATUSES),
    ("spec_cost", ("steps", 0, "drafts", 0, "verdict"), trace.DRAFT_VERDICTS),
    ("spec_cost", ("steps", 0, "final_kind"), trace.FINAL_KINDS),
    ("spec_cost", ("steps", 0, "gamma_policy"), trace.GAMMA_POLICIES),
    ("dspark_tree", ("steps", 1, "nodes", 0, "verdict"), trace.NODE_VERDICTS),
    ("dspark_tree", ("steps", 1, "select"), trace.DSPARK_SELECT),
    ("dspark_tree", ("steps", 1, "next_from"), trace.NEXT_FROM),
]


@pytest.mark.parametrize("name,path,values", [pytest.param(*f, id=f"{f[0]}:{_dotted(f[1])}") for f in CLOSED_FIELDS])
@pytest.mark.parametrize("bad", ["maybe", "Accepted", "recorded "])
def test_value_outside_its_closed_set_refused(name, path, values, bad):
    data = golden(name)
    _set_path(data, path, bad)
    assert f"is not one of {', '.join(values)}" in refused(data, f"{_dotted(path)}={bad!r}")


def test_closed_sets_are_the_engines():
    """The loader's sets are exactly what the engine writes (processors' names, the configs' choices),
    and a trace from before 1.5 that uses every value of a set loads."""
    from decoding.core import config, processors
    names = {cls.name for cls in vars(processors).values() if isinstance(cls, type) and isinstance(
        getattr(cls, "name", None), str)}
    assert set(trace.FILTER_NAMES) == names
    assert trace.GAMMA_POLICIES == config.GAMMA_POLICIES and trace.DSPARK_SELECT == config.DSPARK_SELECT
    assert trace.DRAFT_VERDICTS[:3] == trace.NODE_VERDICTS
    for field, values in [(("steps", 0, "gamma_policy"), trace.GAMMA_POLICIES)]:
        for value in values:
            data = golden("spec_cost")
            _set_path(data, field, value)
            assert from_json(json.dumps(data)).steps[0].gamma_policy == value


@pytest.mark.parametrize("version", ["１.5", " 1.5", "1.5 ", "1.5\n", "+1.5", "1.+5", "1.5_0", "1_0.5", "1.٥", "01.5",
                                     "1.05", "1.5.0", "1,5", "1.", ".5", "", "1.1234567890", 1.5, None, ["1.5"]])
def test_schema_version_not_plain_ascii_major_minor_refused(version):
    data = golden("sample")
    data["schema_version"] = version
    assert "is not 'major.minor' (ASCII digits" in refused(data, "schema_version=")


@pytest.mark.parametrize("version", ["1.0", "1.5", "1.10", "1.99"])
def test_schema_version_of_this_major_loads(version):
    data = _as_version_1_0(golden("sample"))           # without the fields later minors added (1.0 has none)
    data["schema_version"] = version
    assert from_json(json.dumps(data)).schema_version == version


@pytest.mark.parametrize("where", ["config", "model"])
@pytest.mark.parametrize("literal,value", [
    ("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf"), ("1e301", "1e+301"),
    (str(2 ** 63), str(2 ** 63)), ("[1, NaN]", "nan"), ('{"a": {"b": Infinity}}', "inf"),
])
def test_free_form_number_not_finite_or_too_large_refused(where, literal, value):
    """NaN in `config` loaded before, and the trace could not be written again (to_json refuses NaN)."""
    text = json.dumps(golden("sample")).replace(f'"{where}": {{', f'"{where}": {{"x": {literal}, ', 1)
    message = refused(text, f"trace.{where}.x")
    assert value in message


@pytest.mark.parametrize("where", ["config", "model"])
def test_free_form_list_or_object_over_the_limit_refused(where):
    data = golden("sample")
    data[where]["ids"] = list(range(trace.MAX_LIST_ITEMS + 1))
    refused(data, f"trace.{where}.ids: a list of 4097 items is over the 4096 item limit")
    data = golden("sample")
    data[where]["deep"] = {"map": {str(i): i for i in range(trace.MAX_LIST_ITEMS + 1)}}
    refused(data, f"trace.{where}.deep.map: an object of 4097 fields is over the 4096 field limit")
    data = golden("sample")                                 # control: at the limit, nulls and bools load
    data[where].update(ids=list(range(trace.MAX_LIST_ITEMS)), none=None, flag=True, half=0.5)
    assert trace.to_json(from_json(json.dumps(data)))


@pytest.mark.parametrize("name,mutate,field", [
    ("sample", lambda d: d["output_ids"].__setitem__(3, d["output_ids"][3] + 1), "trace.output_ids[3]="),
    ("sample", lambda d: d["output_ids"].pop(), "trace.output_ids: has 19 tokens; expected 20"),
    ("spec_cost", lambda d: d["output_ids"].append(d["output_ids"][0]), "trace.output_ids: has 21 tokens"),
    ("beam", lambda d: d["output_ids"].reverse(), "trace.output_ids[0]="),
    ("dspark_tree", lambda d: d.update(output_ids=d["output_ids"][1:]), "trace.output_ids[0]="),
    ("greedy_forced", lambda d: d["forced_ids"].__setitem__(1, 29), "trace.forced_ids[1]=29 is not output_ids'"),
])
def test_output_ids_not_the_steps_tokens_refused(name, mutate, field):
    data = golden(name)
    mutate(data)
    refused(data, field)


@pytest.mark.parametrize("name,mutate,field", [
    ("sample", lambda s: s.update(new_tokens=21), "trace.stats.new_tokens=21 is not the 20 tokens of output_ids"),
    ("sample", lambda s: s.update(target_forwards=19), "trace.stats.target_forwards=19 is not the steps' 20"),
    ("spec_cost", lambda s: s.update(target_forwards=1), "trace.stats.target_forwards=1"),
    ("spec_cost", lambda s: s.update(mean_accepted_length=3.5), "trace.stats.mean_accepted_length=3.5"),
    ("spec_cost", lambda s: s.update(acceptance_rate=1.0), "trace.stats.acceptance_rate=1.0"),
    ("spec_cost", lambda s: s["per_position_acceptance"].append(0.5), "trace.stats.per_position_acceptance="),
    ("dspark_tree", lambda s: s.update(per_position_acceptance=[1.0] * 4096), "trace.stats.per_position_acceptance="),
    ("sample", lambda s: s.update(acceptance_rate=0.5),
     "trace.stats.acceptance_rate=0.5 is not the steps' value (None)"),
    ("sample", lambda s: s.update(wall_s=-1.0), "trace.stats.wall_s=-1.0"),
    ("sample", lambda s: s.update(tokens_per_s=-20.0), "trace.stats.tokens_per_s=-20.0"),
])
def test_stats_not_the_steps_refused(name, mutate, field):
    data = golden(name)
    mutate(data["stats"])
    refused(data, field)


def test_config_of_another_strategy_refused():
    data = golden("sample")
    data["config"]["strategy"] = "greedy"
    refused(data, "trace.config.strategy='greedy' is not the trace's strategy 'sample'")
    data["config"].pop("strategy")                          # a config that does not say: loads
    assert from_json(json.dumps(data)).strategy == "sample"


def test_stats_metric_not_recorded_loads():
    """A metric recorded as null is not recorded (the views show it as missing); a recorded one must agree."""
    data = golden("spec_cost")
    data["stats"].update(mean_accepted_length=None, acceptance_rate=None, per_position_acceptance=None)
    assert from_json(json.dumps(data)).stats.acceptance_rate is None


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d.update(stop_reason="eos", error="logits: NaN at step 3"), "trace.error='logits: NaN at step 3' is a "
     "message, but stop_reason is 'eos'"),
    (lambda d: d.update(stop_reason="error", error=None), "trace.error=None holds no message"),
    (lambda d: d.update(stop_reason="error", error="first line\nsecond line"), "trace.error="),
    (lambda d: d.update(steps=[], output_ids=[], stats={**d["stats"], "new_tokens": 0, "target_forwards": 0}),
     "trace.text="),
])
def test_stop_error_and_text_that_contradict_the_steps_refused(mutate, field):
    data = golden("sample")
    mutate(data)
    refused(data, field)
    data = golden("sample")                                 # control: an error with its stop reason loads
    data.update(stop_reason="error", error="logits: NaN at step 20")
    assert from_json(json.dumps(data)).error


@pytest.mark.parametrize("name,mutate,field", [
    ("spec_cost", lambda s: s["drafts"][1].update(verdict="accepted"),
     "trace.steps[0].drafts[1].verdict='accepted' is not 'not_reached' (gamma=3, accepted=0)"),
    ("spec_cost", lambda s: s.update(gamma=2), "trace.steps[0].drafts[2].verdict='not_reached' is not 'recorded'"),
    ("spec_cost", lambda s: s.update(final_id=None), "trace.steps[0].final_id=None does not go with final_kind "
                                                     "'residual'"),
    ("dspark_tree", lambda s: s["nodes"][0].update(verdict="accepted"),
     "trace.steps[1].nodes[0].verdict='accepted' but node 1 is not on accepted_path"),
    ("dspark_tree", lambda s: s.update(next_from="prefill"), "trace.steps[1].next_from='prefill' does not go with "
                                                             "prefill=False"),
])
def test_round_verdicts_that_contradict_the_round_refused(name, mutate, field):
    data = golden(name)
    mutate(data["steps"][0 if name == "spec_cost" else 1])
    refused(data, field)


def test_prefill_round_that_drafts_refused():
    data = golden("dspark_tree")
    data["steps"][0].update(next_from="bonus")
    refused(data, "trace.steps[0].next_from='bonus' does not go with prefill=True")
    data = golden("dspark_tree")
    data["steps"][0].update(lattice=data["steps"][1]["lattice"])
    refused(data, "trace.steps[0]: the prefill round has 6 lattice positions")
