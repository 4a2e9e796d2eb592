"""Built programs that several test folders check the same way: (model,
topology, strategy) for distsim.api.build_program, by name. The names are
parametrize ids, so they are needed at collection time (a fixture cannot
give them). Imported as a module: pytest puts this folder, where the root
conftest.py lives, on the path."""

#: DataParallel, and the transformer lowering with pipelines, ZeRO-3,
#: coarsening and symmetry
LOGGED_PROGRAMS = {
    "dp-mlp": ("mlp", "dgx-a100", dict(dp=4, layers=3)),
    "gpt-tp-pp": ("tiny", "dgx-a100", dict(dp=2, tp=2, pp=2, dtype="f32")),
    "gpt-zero3-coarsened": ("tiny", "dgx-a100-x2", dict(dp=4, tp=2, pp=2, zero=3,
                                                        coarsen=True)),
    "gpt-interleaved-symmetry": ("tiny", "dgx-a100-x2", dict(tp=2, pp=2, schedule="interleaved",
                                                             virtual_stages=2, symmetry=True,
                                                             coarsen=True,
                                                             global_batch=16, micro_batch=2)),
}
