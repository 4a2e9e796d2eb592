"""The flat gradient copies a backward leaves waiting for their
reduce-scatters (:class:`distsim.estimate.backward.FlatCopies`): bytes by
hand, ends in order and out of order."""
from distsim.estimate.backward import FlatCopies


def _copies(items):
    flats = FlatCopies()
    for nbytes, end in items:
        flats.append(nbytes, end)
    return flats


def test_the_copies_waiting_past_a_start_and_an_end_and_those_done_drop():
    for items in (((10, 1.0), (20, 2.0), (40, 3.0)), ((10, 1.0), (40, 3.0), (20, 2.0))):
        flats = _copies(items)
        assert flats.ordered == (items[1][1] < items[2][1])
        # a gradient made over 0.5-1.5: all three wait at its start, two at its end
        assert flats.held(0.5, 1.5) == (70, 60)
        assert sorted(flats.waiting()) == [(20, 2.0), (40, 3.0)]
        # a later one over 1.0-2.0: the first is gone already; one waits at its end
        assert flats.held(1.0, 2.0) == (60, 40)
        assert flats.waiting() == [(40, 3.0)] and flats
        assert flats.held(3.0, 3.0) == (0, 0) and not flats
