"""The γ policies behind one interface (decoding/strategies/adaptive_gamma.py): each policy's γ and reason on
given rounds, pinned to the values and words the engine recorded before the policies were classes (the
golden traces spec_lookup, spec_lookup_feature, spec_confidence and spec_cost pin them in whole runs), and
the config's name picking each class. Negative controls: a heuristic schedule that forgets the +2 and a
confidence cut that drops the token below the threshold give other answers on the same rounds."""
from __future__ import annotations

from decoding.core.config import GAMMA_POLICIES, SPEC_MAX_GAMMA, SpeculativeConfig
from decoding.runtime.cost_table import CostTable
from decoding.strategies import adaptive_gamma
from decoding.strategies.adaptive_gamma import (
    AcceptanceCounts,
    ConfidencePolicy,
    CostPolicy,
    GammaPick,
    GammaPolicy,
    HeuristicPolicy,
    choose_gamma,
    make_policy,
    reason,
)

TABLE = CostTable(verify_ms=(10.0, 11.0, 12.0, 19.0, 20.0, 21.0, 22.0), source="test")
# (drafted, accepted) per round, one source
ROUNDS = ((2, 2), (4, 1), (3, 3), (5, 0), (1, 0), (1, 1))


def picks(policy: GammaPolicy, rounds=ROUNDS, source: str = "d") -> list[GammaPick]:
    """The policy's pick before each round and after the last, updated with each round in turn."""
    out = []
    for drafted, accepted in rounds:
        out.append(policy.pick(source))
        policy.update(source, drafted, accepted)
    return out + [policy.pick(source)]


def test_fixed():
    got = picks(GammaPolicy(4))
    assert got[0] == GammaPick(4, "fixed: start at gamma=4")
    assert all(p == GammaPick(4, "fixed: gamma=4") for p in got[1:])
    assert GammaPolicy(4).threshold is None and GammaPolicy(4).cut([0.9, 0.01, 0.5]) == (3, "")


def test_heuristic():
    got = picks(HeuristicPolicy(2))
    assert [p.gamma for p in got] == [2, 4, 3, 5, 4, 3, 5]
    assert [p.reason for p in got] == [
        "heuristic: start at gamma=2",
        "heuristic: last round all 2 drafts accepted: 2+2 -> 4",
        "heuristic: last round 1/4 accepted: 4-1 -> 3",
        "heuristic: last round all 3 drafts accepted: 3+2 -> 5",
        "heuristic: last round 0/5 accepted: 5-1 -> 4",
        "heuristic: last round 0/1 accepted: 4-1 -> 3",
        "heuristic: last round all 1 drafts accepted: 3+2 -> 5"]
    assert all(p.choice is None for p in got)
    assert [p.gamma for p in picks(HeuristicPolicy(1), ((1, 0), (1, 0)))] == [1, 1, 1]           # at least 1
    assert [p.gamma for p in picks(HeuristicPolicy(SPEC_MAX_GAMMA - 1), ((31, 31), (32, 32)))] == [31, 32, 32]


def test_heuristic_negative_control():
    class NoGrowth(HeuristicPolicy):
        def update(self, source, drafted, accepted):
            self.gamma = max(1, self.gamma - (accepted != drafted))

    assert [p.gamma for p in picks(NoGrowth(2))] != [p.gamma for p in picks(HeuristicPolicy(2))]


def test_confidence():
    policy = ConfidencePolicy(6, 0.3)
    got = picks(policy)
    assert got[0] == GammaPick(6, "confidence: start at gamma=6")
    assert all(p == GammaPick(6, "confidence: up to 6, stop below q_draft 0.3") for p in got[1:])
    assert policy.threshold == 0.3
    assert policy.cut([0.9, 0.2, 0.8]) == (2, "; stopped after 2 (q_draft=0.200 < 0.3)")
    assert policy.cut([0.9, 0.1]) == (2, "; stopped after 2 (q_draft=0.100 < 0.3)")
    assert policy.cut([0.9, 0.8]) == (2, "") and policy.cut([0.3]) == (1, "")          # at the threshold: kept


def test_confidence_negative_control():
    """A cut that stops before the low token (not after it) keeps one draft fewer."""
    policy = ConfidencePolicy(6, 0.3)
    before = next(i for i, q in enumerate([0.9, 0.2, 0.8]) if q < 0.3)
    assert policy.cut([0.9, 0.2, 0.8])[0] != before


def test_cost():
    """The choices of test_spec_cost by hand (γ 1 for a 1 ms draft, γ 2 for free lookup with no history),
    then each pick is choose_gamma over the counts of the same source's earlier rounds."""
    policy = CostPolicy(TABLE, {"d": 1.0, "lookup": 0.0}, 3)
    first = policy.pick("d")
    assert first.gamma == 1 and first.choice.source == "d" and first.reason == reason(first.choice)
    assert first.reason == ("cost: γ=1 has the fewest ms per expected token for d "
                            "(8.0 ms: 1.50 tokens expected for 12.0 ms)")
    assert policy.pick("lookup").gamma == 2
    counts = {"d": AcceptanceCounts(), "lookup": AcceptanceCounts()}
    for source, (drafted, accepted) in zip(["d", "lookup"] * 3 + ["d"] * 6, ROUNDS * 2 + ((3, 3),) * 6):
        pick = policy.pick(source)
        assert pick.choice == choose_gamma(counts[source], TABLE, {"d": 1.0, "lookup": 0.0}[source], 3, source)
        policy.update(source, drafted, accepted)
        counts[source].update(drafted, accepted)
    assert policy.pick("d").gamma == 2 and policy.pick("lookup").gamma == 2     # the counts moved d's choice


def test_each_policy_name_picks_its_class(tmp_path):
    assert tuple(adaptive_gamma.POLICIES) == GAMMA_POLICIES
    table = tmp_path / "table.json"
    TABLE.save(table)

    class Drafter:
        def token_ms(self, lm):
            return {"d": 1.0}

    kinds = {"fixed": GammaPolicy, "heuristic": HeuristicPolicy, "confidence": ConfidencePolicy, "cost": CostPolicy}
    for name, cls in kinds.items():
        extra = {"cost_table": str(table)} if name == "cost" else {}
        config = SpeculativeConfig(gamma=5, gamma_policy=name, confidence_threshold=0.25, **extra)
        policy = make_policy(config, None, Drafter())
        assert type(policy) is cls and policy.name == name
        assert policy.pick("d").gamma == (1 if name == "cost" else 5)
        assert policy.threshold == (0.25 if name == "confidence" else None)
    assert make_policy(SpeculativeConfig(gamma=5, gamma_policy="cost", cost_table=str(table)), None,
                       Drafter()).draft_ms == {"d": 1.0}

