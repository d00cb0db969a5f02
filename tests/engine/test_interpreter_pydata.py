"""The interpreter with the libraries an agent's analysis uses (issue 44 item 5), on the real
engine and the pydata image (numpy, pandas, matplotlib from wheels, scripts/engine-up; no network
in the sandbox): a matplotlib figure comes back as PNG — shown, left open, or the last value — a
DataFrame as HTML, state across calls. The autouse witness proves no container is left."""

from __future__ import annotations

import base64
import json
import struct

from sbxkit._consumers.interpreter import open_interpreter
from sbxkit._model.spec import SandboxSpec
from sbxkit.engine.client import Engine
from tests.engine.test_session import session_spec

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def spec(image: str) -> SandboxSpec:
    return session_spec(image, None, timeout_s=120, memory_bytes=512 * 1024 * 1024)


def png_size(data: str) -> tuple[int, int]:
    """A base64 PNG's width and height, from its IHDR chunk (checked to be one)."""
    png = base64.b64decode(data, validate=True)
    assert png[:8] == PNG_SIGNATURE
    assert png[12:16] == b"IHDR"
    assert png[-8:-4] == b"IEND"
    width, height = struct.unpack(">II", png[16:24])
    return width, height


async def test_a_shown_figure_comes_back_as_png_and_is_closed(
    pydata_image: str, engine: Engine
) -> None:
    async with open_interpreter(spec(pydata_image), engine=engine) as interp:
        result = await interp.run_code(
            "import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots(figsize=(4, 3), dpi=50)\n"
            "ax.plot([1, 3, 2])\n"
            "plt.show()\n"
        )
        assert result.status == "ok", result
        assert result.text is None  # plt.show() returns None: no value, one display
        assert len(result.displays) == 1, result.displays
        shown = result.displays[0]
        assert png_size(shown["image/png"]) == (200, 150)  # figsize x dpi
        assert shown["text/plain"].startswith("<Figure size 200x150")
        closed = await interp.run_code("plt.get_fignums()")
        assert (closed.text, closed.displays) == ("[]", [])
        two = await interp.run_code(
            "for n in (1, 2):\n"
            "    plt.figure(figsize=(n, 1), dpi=40)\n"
            "    plt.bar([0, 1], [n, 2])\n"
        )
        assert [png_size(d["image/png"]) for d in two.displays] == [(40, 40), (80, 40)]


async def test_a_figure_as_the_last_value_is_its_png_and_not_shown_twice(
    pydata_image: str, engine: Engine
) -> None:
    async with open_interpreter(spec(pydata_image), engine=engine) as interp:
        result = await interp.run_code(
            "import matplotlib\n"
            "matplotlib.use('Agg')\n"
            "from matplotlib import pyplot\n"
            "fig = pyplot.figure(figsize=(3, 2), dpi=30)\n"
            "fig.gca().scatter([1, 2], [3, 4])\n"
            "fig"
        )
        assert result.status == "ok", result
        assert png_size(result.data["image/png"]) == (90, 60)
        assert result.displays == []  # the value's own PNG, not a second copy


async def test_a_dataframe_is_html_and_state_lives_between_calls(
    pydata_image: str, engine: Engine
) -> None:
    async with open_interpreter(spec(pydata_image), engine=engine) as interp:
        setup = await interp.run_code(
            "import numpy as np, pandas as pd\n"
            "df = pd.DataFrame({'city': ['Oslo', 'Lima'], 'temp': np.array([3.5, 19.0])})"
        )
        assert setup.status == "ok", setup
        frame = await interp.run_code("df.sort_values('temp', ascending=False)")
        assert frame.status == "ok", frame
        html = frame.data["text/html"]
        assert html.count("<table") == 1
        assert html.index("Lima") < html.index("Oslo")  # sorted, in the table itself
        assert "<td>19.0</td>" in html
        assert "Lima" in (frame.text or "")
        mean = await interp.run_code("float(df['temp'].mean())")
        assert mean.text == "11.25"
        series = await interp.run_code(
            "class Summary:\n"
            "    def __init__(self, d): self.d = d\n"
            "    def _repr_json_(self): return self.d\n"
            "Summary(df.set_index('city')['temp'].to_dict())"
        )
        assert json.loads(series.data["application/json"]) == {"Oslo": 3.5, "Lima": 19.0}
        missing = await interp.run_code("df['nope']")
        assert missing.error is not None
        assert missing.error.name == "KeyError"
        assert "df['nope']" in missing.error.traceback
