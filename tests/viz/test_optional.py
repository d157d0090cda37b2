"""matplotlib stays optional: attnlab.viz imports without it, and plots say how to install it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attnlab.viz import mask_data, plot_masks, plot_positional


def test_plots_without_matplotlib_raise_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # "import matplotlib" now fails
    for plot in (plot_masks, lambda: plot_positional("sinusoidal")):
        with pytest.raises(ImportError, match=r"pip install 'attnlab\[viz\]'"):
            plot()
    assert mask_data(seq_len=4)["causal"].shape == (4, 4)  # the data needs no matplotlib


def test_importing_viz_does_not_import_matplotlib() -> None:
    code = "import sys, attnlab.viz, attnlab.cli.viz; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
