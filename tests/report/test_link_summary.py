"""summary.json lists the busiest links with exact utilisation."""
from distsim.report import summarize
from distsim.sim.trace import DeviceInfo, LinkRecord, OpRecord, Trace


def test_links_ranked_by_busy_time_with_utilisation():
    trace = Trace(devices=[DeviceInfo(0, "gpu0", 100)],
                  ops=[OpRecord(0, "comm", "ar", "comm.allreduce", "communication", 0.0, 2.0)],
                  links=[LinkRecord("a", "b", 10.0, 5.0, 0.5, 1),
                         LinkRecord("b", "a", 10.0, 15.0, 1.5, 2)],
                  step_time_s=2.0)
    links = summarize(trace)["links"]
    assert [(k["src"], k["dst"]) for k in links] == [("b", "a"), ("a", "b")]
    assert links[0]["utilisation"] == 15.0 / (10.0 * 2.0)
    assert links[0]["peak_flows"] == 2 and links[1]["busy_s"] == 0.5
