"""Stage-1 selection: the chain DP and best-first tree against brute force on small random lattices
(parent-dependent scores, exact Fractions), the cost-aware size choice, and the cost table."""
from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest

from decoding.core.errors import ConfigError
from decoding.core.lattice import Lattice
from decoding.runtime.cost_table import CostTable, profile_verify_cost
from decoding.strategies.dspark_select import best_chain, best_tree, chain_value, choose_chain, choose_tree


def random_lattice(rng: random.Random, gamma: int, k: int, denom: int = 20) -> Lattice:
    """Parent-dependent scores as exact Fractions (ties are possible and allowed)."""
    tokens = [rng.sample(range(50), k) for _ in range(gamma)]
    q_draft = [[Fraction(1, k)] * k for _ in range(gamma)]
    scores = [[[Fraction(rng.randint(0, denom), denom) for _ in range(k)]
               for _ in range(1 if pos == 0 else k)] for pos in range(gamma)]
    return Lattice(tokens, q_draft, scores)


def path_steps(lattice: Lattice, path) -> list:
    return [lattice.score(pos, path[pos - 1] if pos else 0, j) for pos, j in enumerate(path)]


def brute_chain(lattice: Lattice, length: int):
    widths = [range(len(lattice.token_ids[pos])) for pos in range(length)]
    return max(chain_value(path_steps(lattice, p)) for p in itertools.product(*widths))


def greedy_chain_ignoring_parent(lattice: Lattice) -> list:
    """Deliberately wrong: per position, the candidate with the best score under parent row 0."""
    return [max(range(len(lattice.token_ids[pos])), key=lambda j: lattice.scores[pos][0][j])
            for pos in range(lattice.gamma)]


def rooted_subtrees(lattice: Lattice, budget: int):
    """Every connected set of nodes containing the root, of size <= budget (each set once):
    yields the sum of survival products of its nodes. A node is (depth, cand, survival)."""
    def children(node):
        depth, cand, survival = node
        if depth == lattice.gamma:
            return []
        return [(depth + 1, j, survival * lattice.score(depth, cand, j))
                for j in range(len(lattice.token_ids[depth]))]

    def grow(total, size, frontier):
        yield total
        if size == budget:
            return
        for i, node in enumerate(frontier):
            yield from grow(total + node[2], size + 1, frontier[i + 1:] + children(node))

    roots = [(1, j, lattice.score(0, 0, j)) for j in range(len(lattice.token_ids[0]))]
    yield from grow(0, 0, roots)


CASES = [(g, k, seed) for g in range(1, 7) for k in (1, 2, 3) for seed in range(4)]


@pytest.mark.parametrize("gamma,k,seed", CASES)
def test_chain_dp_matches_brute_force(gamma, k, seed):
    lattice = random_lattice(random.Random(1000 * gamma + 10 * k + seed), gamma, k)
    for length in range(1, gamma + 1):
        plan = best_chain(lattice, length)
        assert len(plan.path) == length
        assert plan.expected_accepted == chain_value(plan.scores) == chain_value(path_steps(lattice, plan.path))
        assert plan.expected_accepted == brute_chain(lattice, length)


def test_dp_table_and_back_pointers_describe_the_path():
    lattice = random_lattice(random.Random(7), 5, 3)
    plan = best_chain(lattice)
    assert plan.values[0][0][plan.path[0]] == plan.expected_accepted
    for pos in range(1, 5):
        assert plan.back[pos - 1][plan.path[pos - 1]] == plan.path[pos]
        j, parent = plan.path[pos], plan.path[pos - 1]
        assert plan.values[pos][parent][j] == max(plan.values[pos][parent])
    assert plan.back[-1] == (None, None, None)
    assert plan.parents == (-1, 0, 1, 2, 3)


def test_wrong_dp_ignoring_parent_is_beaten_by_brute_force():
    """Negative control: a per-position greedy that ignores parent dependence loses somewhere."""
    beaten = 0
    for seed in range(40):
        lattice = random_lattice(random.Random(seed), 4, 3)
        wrong = chain_value(path_steps(lattice, greedy_chain_ignoring_parent(lattice)))
        assert wrong <= brute_chain(lattice, 4)
        beaten += wrong < brute_chain(lattice, 4)
    assert beaten > 0


TREE_CASES = [(g, k, seed) for g in range(1, 7) for k in (1, 2, 3) for seed in range(2)]


@pytest.mark.parametrize("gamma,k,seed", TREE_CASES)
def test_best_first_tree_matches_brute_force(gamma, k, seed):
    lattice = random_lattice(random.Random(77 + 1000 * gamma + 10 * k + seed), gamma, k)
    for budget in range(1, 6 if k < 3 else 5):
        plan = best_tree(lattice, budget)
        best = max(rooted_subtrees(lattice, budget))
        assert plan.expected_accepted == best
        assert all(node.parent < i for i, node in enumerate(plan.nodes))   # parents first


def test_tree_nodes_are_consistent_with_the_lattice():
    lattice = random_lattice(random.Random(3), 4, 3)
    plan = best_tree(lattice, 12)
    for node in plan.nodes:
        parent = plan.nodes[node.parent] if node.parent >= 0 else None
        assert node.depth == (parent.depth + 1 if parent else 1)
        assert node.token == lattice.token_ids[node.depth - 1][node.cand]
        assert node.score == lattice.score(node.depth - 1, parent.cand if parent else 0, node.cand)
        assert node.survival == (parent.survival if parent else 1) * node.score
    survivals = [n.survival for n in plan.nodes]
    assert survivals == sorted(survivals, reverse=True)


def test_wrong_tree_by_own_score_is_beaten():
    """Negative control: taking nodes by their own ŝ (not the survival product) loses somewhere."""
    def by_own_score(lattice, budget):
        """Grow a connected tree, each time taking the frontier node with the highest own ŝ."""
        frontier = [(lattice.score(0, 0, j), lattice.score(0, 0, j), 1, j)   # (ŝ, survival, depth, cand)
                    for j in range(len(lattice.token_ids[0]))]
        total = 0
        for _ in range(budget):
            if not frontier:
                break
            frontier.sort(key=lambda node: -node[0])
            _, survival, depth, cand = frontier.pop(0)
            total += survival
            if depth < lattice.gamma:
                frontier += [(lattice.score(depth, cand, j), survival * lattice.score(depth, cand, j), depth + 1, j)
                             for j in range(len(lattice.token_ids[depth]))]
        return total

    beaten = 0
    for seed in range(30):
        lattice = random_lattice(random.Random(seed), 4, 2)
        beaten += by_own_score(lattice, 4) < max(rooted_subtrees(lattice, 4))
    assert beaten > 0


def test_chain_chosen_by_cost_maximizes_tokens_per_second():
    lattice = Lattice.independent([[1], [2], [3], [4]], [[0.9]] * 4, [[0.9], [0.5], [0.2], [0.05]])
    flat = CostTable(verify_ms=(10.0,) * 5)
    plan, choice = choose_chain(lattice, flat)
    assert choice.size == 4 and plan.tokens == (1, 2, 3, 4)      # free tokens: take everything
    steep = CostTable(verify_ms=(10.0, 12.0, 20.0, 40.0, 80.0))
    plan, choice = choose_chain(lattice, steep, overhead_ms=2.0)
    expected = [0.9, 0.9 + 0.45, 0.9 + 0.45 + 0.09, 0.9 + 0.45 + 0.09 + 0.0045]
    rates = [1000 * (1 + e) / (steep.ms(n + 1) + 2.0) for n, e in enumerate(expected, 1)]
    assert choice.size == max(range(1, 5), key=lambda n: rates[n - 1]) == 1
    assert choice.tokens_per_s == pytest.approx(rates)
    assert len(plan.path) == 1


def test_tree_budget_chosen_by_cost():
    lattice = random_lattice(random.Random(5), 3, 3)
    table = CostTable(verify_ms=tuple(10.0 + 3.0 * n for n in range(1, 13)))
    plan, choice = choose_tree(lattice, table, max_budget=11, overhead_ms=1.0)
    best = max(range(1, 12), key=lambda n: (1 + float(best_tree(lattice, n).expected_accepted))
               / (table.ms(n + 1) + 1.0))
    assert choice.size == best == len(plan.nodes)


def test_cost_table_json_round_trip(tmp_path):
    table = CostTable(verify_ms=(41.0, 45.5, 59.0), device="cpu", model="tiny")
    path = tmp_path / "cost.json"
    table.save(path)
    loaded = CostTable.load(path)
    assert loaded.verify_ms == table.verify_ms and loaded.source == path.name    # no folder: traces record it
    assert loaded.ms(2) == 45.5
    with pytest.raises(ConfigError, match="cost_table"):
        loaded.ms(4)
    (tmp_path / "bad.json").write_text('{"version": 1, "verify_ms": [1, -2]}')
    with pytest.raises(ConfigError, match="cost_table"):
        CostTable.load(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="could not be read"):
        CostTable.load(tmp_path / "missing.json")


@pytest.mark.slow
def test_profile_verify_cost_on_tiny_model(tiny_lm):
    cache_before = tiny_lm.new_cache()
    table = profile_verify_cost(tiny_lm, max_tokens=4, repeats=2, prefix_tokens=8)
    assert table.max_tokens == 4 and all(v > 0 for v in table.verify_ms)
    assert list(table.verify_ms) == sorted(table.verify_ms)            # noise never makes more tokens cheaper
    assert cache_before.get_seq_length() == 0


def test_a_profiled_cost_is_pooled_where_noise_makes_more_tokens_cheaper():
    """Pool adjacent violators: the least-squares non-decreasing fit (a busy moment's median pooled with its
    neighbours), the total kept; an ordered table passes unchanged."""
    from decoding.runtime.cost_table import non_decreasing
    assert non_decreasing([160.0, 171.0, 138.0, 180.0]) == pytest.approx([469 / 3] * 3 + [180.0])   # 154.5 < 160
    assert non_decreasing([5.0, 4.0, 3.0]) == [4.0, 4.0, 4.0]
    assert non_decreasing([1.0, 2.0, 2.0, 9.0]) == [1.0, 2.0, 2.0, 9.0]
    noisy = [100, 140, 120, 130, 90, 200, 210, 205]
    fitted = non_decreasing(noisy)
    assert fitted == sorted(fitted) and sum(fitted) == pytest.approx(sum(noisy))
    # control: a running maximum is non-decreasing too, but not the least-squares fit (it only raises)
    running = [max(noisy[:i + 1]) for i in range(len(noisy))]
    assert sum((a - b) ** 2 for a, b in zip(fitted, noisy)) < sum((a - b) ** 2 for a, b in zip(running, noisy))


@pytest.mark.parametrize("kwargs,param", [
    ({"token_ids": [], "q_draft": [], "scores": []}, "gamma"),
    ({"token_ids": [[1]] * 17, "q_draft": [[1]] * 17, "scores": [[[1]]] * 17}, "gamma"),
    ({"token_ids": [[]], "q_draft": [[]], "scores": [[[]]]}, "top_k_candidates"),
    ({"token_ids": [[1, 1]], "q_draft": [[0.5, 0.5]], "scores": [[[0.5, 0.5]]]}, "token_ids"),
    ({"token_ids": [[1]], "q_draft": [[0.5]], "scores": [[[1.5]]]}, "scores"),
    ({"token_ids": [[1], [2]], "q_draft": [[0.5], [0.5]], "scores": [[[0.5]], [[0.5], [0.5]]]}, "scores"),
])
def test_bad_lattices_are_one_line_errors(kwargs, param):
    with pytest.raises(ConfigError) as err:
        Lattice(**kwargs)
    assert err.value.param == param and "\n" not in str(err.value)


def test_bad_budget_and_length():
    lattice = random_lattice(random.Random(0), 3, 2)
    for bad in (0, 257, 1.5):
        with pytest.raises(ConfigError, match="budget"):
            best_tree(lattice, bad)
    for bad in (0, 4):
        with pytest.raises(ConfigError, match="length"):
            best_chain(lattice, bad)


def test_cost_table_save_is_atomic_under_concurrent_writers(tmp_path):
    """Threads saving the same cached table while others read it: every read sees a whole table."""
    import threading

    path = tmp_path / "table.json"
    tables = [CostTable(verify_ms=tuple(float(i + n) for n in range(1, 200))) for i in range(4)]
    tables[0].save(path)
    errors: list = []

    def write(table):
        for _ in range(50):
            table.save(path)

    def read():
        for _ in range(200):
            try:
                assert CostTable.load(path).max_tokens == 199
            except Exception as err:            # noqa: BLE001  (any failure to read is the bug)
                errors.append(err)

    threads = [threading.Thread(target=write, args=(t,)) for t in tables] + [threading.Thread(target=read)
                                                                             for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:1]
    assert not list(tmp_path.glob(".*.tmp"))
