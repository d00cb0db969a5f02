"""The interpreter sbxkit runs inside a sandbox (``open_interpreter``): standard-library Python,
sent as ``python3 -c SOURCE``, nothing installed in the image.

Modules named after the source (``python3 -c SOURCE numpy pandas``: ``preload``) are imported
before it says it is ready. It speaks frames over its own stdin and a private duplicate of its
stdout (the framing is sbxkit/_consumers/interp_frames.py): a 4-byte big-endian length, then a
JSON object. File descriptors 1 and 2 become pipes that a thread wraps into ``out`` frames, so
whatever the code prints — ``print``, ``os.write(1, ...)``, a child process — arrives as output,
never as a frame. Figures the code leaves open in matplotlib's pyplot (Agg, set through
MPLBACKEND) come back as PNG ``displays`` when the call ends; matplotlib is imported only by the
code, never by this program. SIGINT raises ``KeyboardInterrupt`` only while the code runs: the
host's interrupt of a call that outlived its time limit stops that call and nothing else.

The code shares this process, so it can always make the interpreter say what it likes about
its own call; the host treats every frame as untrusted data (interp_frames.py).
"""

from __future__ import annotations

__all__ = ["INTERPRETER_SOURCE"]

INTERPRETER_SOURCE = r"""
import ast, base64, fcntl, json, linecache, os, select, signal, struct, sys, threading, traceback

PROTO_FD = os.dup(1)
CMD = os.fdopen(os.dup(0), "rb", buffering=0)
NULL = os.open(os.devnull, os.O_RDONLY)
os.dup2(NULL, 0)
LOCK = threading.Lock()
STATE = {"id": 0, "running": False, "cap": 1 << 20}
MAX_IN = 64 << 20


def send(message):
    body = json.dumps(message, default=repr).encode("utf-8")
    view = memoryview(struct.pack(">I", len(body)) + body)
    with LOCK:
        while view:  # a pipe may take part of a large write
            view = view[os.write(PROTO_FD, view):]


def pipe_onto(fd):
    read_end, write_end = os.pipe()
    os.dup2(write_end, fd)
    os.close(write_end)
    flags = fcntl.fcntl(read_end, fcntl.F_GETFL)
    fcntl.fcntl(read_end, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    return read_end


OUT = {pipe_onto(1): "stdout", pipe_onto(2): "stderr"}
WAKE_R, WAKE_W = os.pipe()
DRAINED = threading.Event()
sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)
sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)
sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr


def forward(fd):
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        if not data:
            return
        send({"t": "out", "id": STATE["id"], "s": OUT[fd], "d": base64.b64encode(data).decode()})


def pump():
    while True:
        ready, _, _ = select.select([*OUT, WAKE_R], [], [])
        for fd in ready:
            if fd == WAKE_R:
                os.read(WAKE_R, 64)
                for out in OUT:
                    forward(out)
                DRAINED.set()
            else:
                forward(fd)


def drain():
    DRAINED.clear()
    os.write(WAKE_W, b"x")
    DRAINED.wait(5)


def on_interrupt(signum, frame):
    if STATE["running"]:
        raise KeyboardInterrupt


def read_exact(n):
    data = b""
    while len(data) < n:
        chunk = CMD.read(n - len(data))
        if not chunk:
            os._exit(0)
        data += chunk
    return data


def rich(value, cap):
    found = {}
    for mime, method in (("text/html", "_repr_html_"), ("image/png", "_repr_png_"),
                         ("application/json", "_repr_json_"), ("text/markdown", "_repr_markdown_")):
        fn = getattr(type(value), method, None)
        if fn is None:
            continue
        try:
            data = fn(value)
        except Exception:
            continue
        if data is None:
            continue
        if mime == "image/png":
            if not isinstance(data, bytes):
                continue
            data = base64.b64encode(data).decode()
        elif mime == "application/json":
            data = json.dumps(data, default=repr)
        elif not isinstance(data, str):
            continue
        if len(data) <= cap:
            found[mime] = data
    if is_figure(value):
        try:
            data = figure_png(value)
        except Exception:
            return found
        if len(data) <= cap:
            found["image/png"] = data
    return found


def is_figure(value):
    figure = sys.modules.get("matplotlib.figure")  # only if the code imported matplotlib
    return figure is not None and isinstance(value, figure.Figure)


def figure_png(fig):
    import io
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return base64.b64encode(buffer.getvalue()).decode()


def shown_figures(cap, last):
    # Like a notebook's inline backend: the pyplot figures still open when a cell ends (drawn,
    # or plt.show(), a no-op under Agg) come back as PNG, in order, and are closed. A figure
    # that is the cell's value is in the value already; the budget keeps the frame bounded.
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return []
    shown, budget = [], 4 * cap
    try:
        for num in pyplot.get_fignums():
            fig = pyplot.figure(num)
            if fig is last:
                continue
            try:
                display = {"text/plain": repr(fig)[:200], "image/png": figure_png(fig)}
            except Exception:
                continue
            size = len(json.dumps(display))
            if len(display["image/png"]) > cap or size > budget:
                continue
            budget -= size
            shown.append(display)
    finally:
        pyplot.close("all")
    return shown


def run(code, ns, cap, holder):
    name = "<cell-%d>" % STATE["id"]
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    tree = ast.parse(code, name, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, name, "exec"), ns)
    if last is None:
        return None
    value = eval(compile(last, name, "eval"), ns)
    if value is None:
        return None
    holder[0] = value  # shown_figures leaves a Figure value to the value
    text = repr(value)
    found = {"text/plain": text[:cap]}
    found.update(rich(value, cap))
    return found


def main():
    os.environ.setdefault("MPLBACKEND", "Agg")  # read by matplotlib if the code imports it
    signal.signal(signal.SIGINT, on_interrupt)
    threading.Thread(target=pump, daemon=True).start()
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    ready = {"t": "ready", "python": sys.version.split()[0]}
    for name in sys.argv[1:]:  # preload: imported before ready, into sys.modules only
        try:
            __import__(name)
        except BaseException as exc:
            ready["preload_error"] = "%s: %s: %s" % (name, type(exc).__name__, str(exc)[:500])
            break
    sys.argv[1:] = []
    send(ready)
    while True:
        (size,) = struct.unpack(">I", read_exact(4))
        if size > MAX_IN:
            os._exit(70)
        request = json.loads(read_exact(size))
        STATE["id"] = request["id"]
        cap = int(request["cap"])
        value = error = None
        displays, holder = [], [None]
        try:
            STATE["running"] = True
            try:
                value = run(request["code"], ns, cap, holder)
            finally:
                displays = shown_figures(cap, holder[0])
            STATE["running"] = False
        except BaseException as exc:
            STATE["running"] = False
            tb = exc.__traceback__
            while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
                tb = tb.tb_next
            error = {
                "name": type(exc).__name__,
                "value": str(exc)[:cap],
                "traceback": "".join(traceback.format_exception(type(exc), exc, tb))[-cap:],
            }
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        drain()
        send({"t": "result", "id": request["id"], "value": value, "error": error,
              "displays": displays})


main()
"""
