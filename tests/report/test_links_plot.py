"""links.png from a real simulated run, with and without samples."""
import simpy

from distsim.ir.comm import CollectiveType as C
from distsim.report.links import busiest, plot_links
from distsim.sim.collectives import run_collective
from distsim.sim.network import Network
from distsim.topology import load_topology


def test_links_png_with_and_without_samples(tmp_path):
    for samples in (False, True):
        env = simpy.Environment()
        net = Network(env, load_topology("dgx-a100"), record_samples=samples)
        env.process(run_collective(env, net, C.ALL_REDUCE, (0, 1, 2, 3), 1e8, algorithm="ring"))
        env.run()
        records = net.link_records()
        assert len(busiest(records, 4)) == 4
        out = tmp_path / f"links{samples}.png"
        plot_links(records, out, samples=net.link_samples(), end_s=env.now)
        assert out.read_bytes()[:4] == b"\x89PNG"
        assert bool(net.link_samples()) == samples
