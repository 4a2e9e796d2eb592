"""``import distsim`` and loading the CLI leave matplotlib and pandas
unloaded: they are imported where a chart or a table is made. Every sweep
worker and every script pays the package's import before its first point,
and they were half of it."""
import subprocess
import sys

CHECK = ("import sys; {stmt}; "
         "heavy = [m for m in ('matplotlib', 'pandas') if m in sys.modules]; "
         "print(','.join(heavy))")


def _heavy_after(stmt: str) -> str:
    out = subprocess.run([sys.executable, "-c", CHECK.format(stmt=stmt)], capture_output=True,
                         text=True, check=True, timeout=120)
    return out.stdout.strip()


def test_import_distsim_loads_no_chart_or_table_library():
    assert _heavy_after("import distsim, distsim.sweep.point") == ""


def test_the_cli_loads_them_only_when_a_command_draws():
    assert _heavy_after("from distsim.cli import main") == ""
