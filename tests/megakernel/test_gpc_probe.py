"""CI (no GPU): tools/gpc_probe.py's grouping -- SMs met in one thread-block cluster share
a GPC, joined transitively; a partial cluster is refused."""
import pytest


@pytest.fixture(scope="module")
def probe(load_tool):
    return load_tool("gpc_probe")


def test_groups_join_sms_met_in_one_cluster_transitively(probe):
    # clusters of 4: {0,1,2,3}, {3,7,7,7} joins 7 to the first; {4,5,4,5} and {5,6,6,6} form a second
    smids = [0, 1, 2, 3, 3, 7, 7, 7, 4, 5, 4, 5, 5, 6, 6, 6]
    assert probe.groups_of(smids, cluster=4) == [[0, 1, 2, 3, 7], [4, 5, 6]]


def test_an_sm_alone_in_its_clusters_is_a_group_of_its_own(probe):
    assert probe.groups_of([9, 9, 2, 1], cluster=2) == [[1, 2], [9]]


def test_a_partial_cluster_is_refused(probe):
    with pytest.raises(ValueError, match="5 blocks is not a whole number of clusters of 4"):
        probe.groups_of([0, 1, 2, 3, 4], cluster=4)


def test_spread_takes_the_last_sm_of_each_largest_group(probe, tmp_path, capsys):
    groups = [[0, 1, 2, 3, 16, 17], [4, 5, 20, 21], [6, 7], [8, 9, 10, 11, 24, 25]]
    assert probe.spread(groups, 2) == [17, 25]
    assert probe.spread(groups, 3) == [17, 21, 25]
    with pytest.raises(ValueError, match="5 SMs from 4 groups"):
        probe.spread(groups, 5)
    f = tmp_path / "gpc_probe.json"
    f.write_text(__import__("json").dumps({"groups": groups}))
    assert probe.main(["--from", str(f), "--spread", "3"]) == 0
    assert capsys.readouterr().out.strip() == "17,21,25"
    with pytest.raises(SystemExit):
        probe.main(["--spread", "3"])
    assert "--from and --spread go together" in capsys.readouterr().err
