"""Unit tests of testbed.model.routing: destination trees, paths, counters and rates (no network)."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest

from testbed.model import routing as r

# Triangle: 1 -(2)- 2 -(3)- 3 and a slow direct 1 -(10)- 3.
TRIANGLE = [(1, 2, 2.0), (2, 3, 3.0), (1, 3, 10.0)]
# Square 1-2-3-4-1 (1 ms each) with the chord 1-3 (1.5 ms).
SQUARE_CHORD = [(1, 2, 1.0), (2, 3, 1.0), (3, 4, 1.0), (4, 1, 1.0), (1, 3, 1.5)]


def _nx(g: r.SwitchGraph) -> nx.Graph:
    """The same graph in networkx (the reference the trees are checked against)."""
    return nx.Graph(g.adj)


def _check_tree_against_dijkstra(g: r.SwitchGraph, root: int) -> dict[int, int]:
    tree = r.shortest_path_tree(g, root)
    assert set(tree) == set(g) - {root}
    assert r.is_loop_free(tree, root)
    dist = nx.single_source_dijkstra_path_length(_nx(g), root, weight="delay_ms")
    for u in tree:
        assert r.path_delay_ms(g, r.tree_path(tree, u, root)) == pytest.approx(dist[u])
    return tree


def test_triangle_next_hops_avoid_the_slow_edge():
    g = r.build_graph(TRIANGLE)
    assert _check_tree_against_dijkstra(g, 3) == {1: 2, 2: 3}
    assert _check_tree_against_dijkstra(g, 1) == {2: 1, 3: 2}
    assert _check_tree_against_dijkstra(g, 2) == {1: 2, 3: 2}
    assert r.tree_path(r.shortest_path_tree(g, 3), 1, 3) == [1, 2, 3]
    assert r.path_delay_ms(g, [1, 2, 3]) == 5.0


def test_triangle_direct_edge_wins_when_fast():
    g = r.build_graph([(1, 2, 2.0), (2, 3, 3.0), (1, 3, 4.0)])
    assert r.shortest_path_tree(g, 3) == {1: 3, 2: 3}


def test_square_with_chord_next_hops_and_ties():
    g = r.build_graph(SQUARE_CHORD)
    # Toward 3: 1 uses the chord (1.5 < 2.0); 2 and 4 are direct neighbours.
    assert _check_tree_against_dijkstra(g, 3) == {1: 3, 2: 3, 4: 3}
    # Toward 1: 3 uses the chord; 2 and 4 direct.
    assert _check_tree_against_dijkstra(g, 1) == {2: 1, 3: 1, 4: 1}
    # Toward 2: 4 has two equal 2 ms paths (4-1-2 and 4-3-2): the lower DPID (1) wins.
    assert _check_tree_against_dijkstra(g, 2) == {1: 2, 3: 2, 4: 1}
    # Toward 4: 2 ties between 2-1-4 and 2-3-4, lower DPID again.
    assert _check_tree_against_dijkstra(g, 4) == {1: 4, 2: 1, 3: 4}


def test_equal_delay_tie_prefers_fewer_hops_then_lower_dpid():
    # 1 -> 4: direct 3.0, or 1-2-4 / 1-3-4 at 1.5 + 1.5 = 3.0: the direct (fewer hops) wins.
    g = r.build_graph([(1, 4, 3.0), (1, 2, 1.5), (2, 4, 1.5), (1, 3, 1.5), (3, 4, 1.5)])
    assert r.shortest_path_tree(g, 4)[1] == 4
    # Float sums that are "equal" (0.1 + 0.2 vs 0.3) are ties too: hop count decides.
    g = r.build_graph([(1, 2, 0.1), (2, 3, 0.2), (1, 3, 0.3)])
    assert r.shortest_path_tree(g, 3)[1] == 3


def test_trees_are_loop_free_and_deterministic_on_random_meshes():
    for seed in range(20):
        base = nx.gnm_random_graph(12, 24, seed=seed)
        if not nx.is_connected(base):
            continue
        links = [(a + 1, b + 1, float((a * 7 + b * 3 + seed) % 4)) for a, b in base.edges]  # includes 0 ms
        g = r.build_graph(links)
        g_rev = r.build_graph(list(reversed(links)))
        for root in g:
            tree = r.shortest_path_tree(g, root)
            assert r.is_loop_free(tree, root)
            assert tree == r.shortest_path_tree(g_rev, root), "result depends on insertion order"
            dist = nx.single_source_dijkstra_path_length(_nx(g), root, weight="delay_ms")
            for u in tree:
                assert r.path_delay_ms(g, r.tree_path(tree, u, root)) == pytest.approx(dist[u])


def test_disconnected_switch_has_no_next_hop():
    g = r.build_graph([(1, 2, 1.0)], nodes=[3])
    tree = r.shortest_path_tree(g, 1)
    assert tree == {2: 1}
    with pytest.raises(r.NoRouteError):
        r.tree_path(tree, 3, 1)
    with pytest.raises(r.NoRouteError):
        r.shortest_path_tree(g, 9)
    assert r.all_trees(g, [1, 9, 1]) == {1: {2: 1}, 9: {}}


def test_tree_path_detects_loops_and_bad_links():
    assert not r.is_loop_free({1: 2, 2: 1}, 3)
    with pytest.raises(r.NoRouteError, match="loop"):
        r.tree_path({1: 2, 2: 1}, 1, 3)
    assert r.tree_path({}, 5, 5) == [5]
    with pytest.raises(r.NoRouteError):
        r.path_delay_ms(r.build_graph(TRIANGLE), [1, 4])


@pytest.mark.parametrize("links", [[(1, 1, 1.0)], [(1, 2, -1.0)], [(1, 2, 1.0), (2, 1, 2.0)],
                                   [(1, 2, float("nan"))]])
def test_build_graph_rejects_bad_links(links):
    with pytest.raises(ValueError):
        r.build_graph(links)


def test_counter_delta_normal_reset_and_unsupported():
    assert r.counter_delta(100, 350) == 250
    assert r.counter_delta(350, 350) == 0
    assert r.counter_delta(5_000, 1_200) == 1_200  # counter restarted from 0
    assert r.counter_delta(None, 10) == 0
    assert r.counter_delta(r.COUNTER_UNSUPPORTED, r.COUNTER_UNSUPPORTED) == 0
    assert r.counter_delta(10, r.COUNTER_UNSUPPORTED) == 0


def test_rate_and_utilization_exact_values():
    assert r.rate_mbps(1_250_000, 1.0) == 10.0  # 10^7 bit in 1 s
    assert r.rate_mbps(625_000, 0.5) == 10.0
    assert r.rate_mbps(100, 0.0) == 0.0
    assert r.utilization(10.0, 100.0) == 0.1
    assert r.utilization(25.0, 50.0) == 0.5
    assert r.utilization(1.0, None) is None and r.utilization(1.0, 0.0) is None


def test_port_delta_uses_switch_uptime_and_counts_drops():
    prev = r.PortSample(t=1000.0, duration_s=10.0, tx_bytes=1_000_000, rx_bytes=0,
                        tx_dropped=5, rx_dropped=1, tx_errors=0, rx_errors=0)
    # Received 1.3 s later, but the switch says 2.0 s passed: the switch's clock is used.
    cur = r.PortSample(t=1001.3, duration_s=12.0, tx_bytes=26_000_000, rx_bytes=2_500_000,
                       tx_dropped=8, rx_dropped=1, tx_errors=2, rx_errors=4)
    d = r.port_delta(prev, cur)
    assert d.dt_s == 2.0 and d.t == 1001.3 and not d.reset
    assert d.tx_mbps == 100.0  # 25e6 B * 8 / 2 s
    assert d.rx_mbps == 10.0
    assert d.tx_drops == 3 + 2 and d.rx_drops == 0 + 4
    assert r.utilization(d.tx_mbps, 1000.0) == 0.1


def test_port_delta_after_counter_reset_uses_receipt_time():
    prev = r.PortSample(t=50.0, duration_s=300.0, tx_bytes=9_000_000, rx_bytes=9_000_000, tx_dropped=70)
    cur = r.PortSample(t=51.0, duration_s=0.5, tx_bytes=125_000, rx_bytes=250_000, tx_dropped=3)
    d = r.port_delta(prev, cur)
    assert d.reset and d.dt_s == 1.0
    assert d.tx_mbps == 1.0 and d.rx_mbps == 2.0
    assert d.tx_drops == 3 and d.rx_drops == 0
    # Without switch uptimes the receipt times are used.
    d = r.port_delta(r.PortSample(0.0, None, 0, 0), r.PortSample(4.0, None, 5_000_000, 0))
    assert d.dt_s == 4.0 and d.tx_mbps == 10.0 and d.rx_mbps == 0.0


def test_every_pair_path_in_square_matches_networkx():
    g = r.build_graph(SQUARE_CHORD)
    trees = r.all_trees(g, g.nodes)
    for s, t in itertools.permutations(g.nodes, 2):
        path = r.tree_path(trees[t], s, t)
        assert path[0] == s and path[-1] == t
        assert r.path_delay_ms(g, path) == pytest.approx(nx.dijkstra_path_length(_nx(g), s, t, weight="delay_ms"))


def test_least_delay_paths_are_the_trees_whatever_the_names_and_the_link_order():
    """The one rule on named switches: the path toward d is the tree rooted at d's, ties to the lower
    DPID, whichever order the links come in (networkx's Dijkstra would follow the insertion order)."""
    dpid = {"a": 1, "b": 2, "c": 3, "d": 4, "z": 9}
    square = [("a", "b", 1.0), ("b", "c", 1.0), ("c", "d", 1.0), ("d", "a", 1.0)]
    pairs = [("d", "b"), ("b", "d"), ("a", "a"), ("a", "z")]
    want = {("d", "b"): ["d", "a", "b"], ("b", "d"): ["b", "a", "d"], ("a", "a"): ["a"], ("a", "z"): None}
    for links in itertools.permutations(square):
        assert r.least_delay_paths(links, pairs, dpid) == want
    renumbered = {**dpid, "a": 5}  # now c (3) is the lower DPID of the two middle switches
    assert r.least_delay_paths(square, [("d", "b")], renumbered) == {("d", "b"): ["d", "c", "b"]}
    g = r.build_graph([(dpid[a], dpid[b], w) for a, b, w in square])
    assert r.tree_path(r.shortest_path_tree(g, 2), 4, 2) == [4, 1, 2]  # the controller's tree, on DPIDs
    with pytest.raises(ValueError, match="same DPID"):
        r.least_delay_paths(square, [("a", "b")], {**dpid, "b": 1})
