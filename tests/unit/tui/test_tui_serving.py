"""Serving view: status card, coalesced telemetry into charts, the log tail, stop, clean shutdown."""

from __future__ import annotations

import asyncio
import time

from metralectl.errors import MetralError
from metralectl.tui.app import MetralectlApp
from metralectl.tui.screens.confirm import ConfirmScreen
from metralectl.tui.views.serving import ServingView
from metralectl.tui.widgets.chart import Chart
from metralectl.tui.widgets.log_tail import LogTail
from metralectl.tui.widgets.serving_card import ServingCard
from tests.unit.tui.conftest import until
from tests.unit.tui.fakes import FakeServices, top_view


def test_status_charts_and_log(services: FakeServices) -> None:
    services.served = ["qwen3.5-35b-a3b"]

    async def scenario() -> None:
        app = MetralectlApp(services, status_every_s=0.2)
        async with app.run_test(size=(120, 40)) as pilot:
            view = app.query_one(ServingView)
            card = app.query_one(ServingCard)
            await until(pilot, lambda: card.report is not None and card.report.serving, what="status")
            assert card.report is not None and card.report.last_swap and "downtime 41.0 s" in card.report.last_swap
            log = app.query_one(LogTail)
            await until(pilot, lambda: log.received == 5, what="log lines")
            assert view.following == "metralectl-qwen3.5-35b-a3b" and log.lines[-1] == "engine line 4"
            await until(pilot, lambda: len(view.history.values("util")) >= 5, what="telemetry")
            temp = app.query_one("#chart-temp", Chart)
            assert temp.current.endswith("°C")
            assert app.query_one("#chart-tok_s", Chart).current.endswith("tok/s")
            assert "GPU-held" in view.history.chart("memory").note
            assert isinstance(app.focused, LogTail)
            await pilot.press("f")
            assert not log.following and "paused" in str(app.query_one("#log-title").render())
            await pilot.press("f")
            assert log.following
            await pilot.press("x")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="stop confirmation")
            assert app.screen.plan.action == "stop" and not app.screen.plan.cancellable  # type: ignore[attr-defined]
            await pilot.press("y")
            await until(pilot, lambda: app.screen.outcome is not None)  # type: ignore[attr-defined]
            await pilot.press("enter")
            await until(pilot, lambda: card.report is not None and not card.report.serving, what="nothing served")
            await until(pilot, lambda: view.following is None, what="log follower stopped")
            assert services.follow_stops[0].is_set()
        feed = services.feeds[0]
        deadline = time.monotonic() + 5
        while not feed.closed and time.monotonic() < deadline:  # its thread wakes and closes it
            await asyncio.sleep(0.01)
        assert feed.started and feed.closed  # the telemetry feed is closed when the app goes

    asyncio.run(scenario())


def test_telemetry_bursts_are_coalesced(services: FakeServices) -> None:
    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=(80, 24)) as pilot:
            view = app.query_one(ServingView)
            await until(pilot, lambda: view.history.latest is not None)
            before = len(view.history.values("util"))
            view.telemetry.extend([top_view(i) for i in range(50)])  # one burst = one message
            await until(pilot, lambda: len(view.history.values("util")) >= before + 50)

    asyncio.run(scenario())


def test_no_gpu_and_no_docker_are_shown_not_raised(services: FakeServices) -> None:
    services.views = [top_view(gpu=False)]
    services.fail["status"] = MetralError("Docker is not running", "sudo systemctl start docker")

    async def scenario() -> None:
        app = MetralectlApp(services, status_every_s=0.1)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: "no GPU" in str(app.query_one("#telemetry-note").render()), what="gpu note")
            await until(pilot, lambda: any("Docker is not running" in n.message for n in app._notifications))
            await pilot.pause(0.5)  # several failed polls ...
            assert sum("Docker is not running" in n.message for n in app._notifications) == 1  # ... one notice
            assert app.query_one("#chart-util", Chart).current == "?"

    asyncio.run(scenario())


def test_log_tail_keeps_max_lines(services: FakeServices) -> None:
    services.served = ["qwen3.5-35b-a3b"]
    services.log_lines = [f"line {i}" for i in range(12000)]

    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=(80, 24)) as pilot:
            log = app.query_one(LogTail)
            await until(pilot, lambda: log.received == 12000, what="all lines")
            assert log.line_count <= 5000 and log.lines[-1] == "line 11999"

    asyncio.run(scenario())


def _drawn_card(services: FakeServices, size: tuple[int, int]) -> str:
    async def scenario() -> str:
        app = MetralectlApp(services, status_every_s=0.2)
        async with app.run_test(size=size) as pilot:
            card = app.query_one(ServingCard)
            await until(pilot, lambda: card.report is not None and card.report.serving, what="status")
            await pilot.pause()
            return "\n".join("".join(seg.text for seg in line) for line in card.render_lines(card.region.reset_offset))

    return asyncio.run(scenario())


def test_the_card_keeps_the_endpoint_whole_at_80_columns_and_the_revision_unshortened(services: FakeServices) -> None:
    services.served = ["qwen3.5-35b-a3b"]
    small = _drawn_card(services, (80, 24))
    assert "http://127.0.0.1:8888/v1" in small, small  # the port survives the smallest designed size
    wide = _drawn_card(services, (200, 40))
    assert "0123456789abcdef" in wide, wide  # the whole revision where there is room


def test_an_unreachable_docker_is_said_not_asked_forever(services: FakeServices) -> None:
    services.fail["status"] = MetralError("cannot connect to the Docker daemon at unix:///var/run/docker.sock")

    async def scenario() -> None:
        app = MetralectlApp(services, status_every_s=0.2)
        async with app.run_test(size=(120, 40)) as pilot:
            card = app.query_one(ServingCard)

            def said() -> bool:
                return "Docker is not answering" in str(card.render())

            await until(pilot, said, what="the unreachable daemon named")
            assert "cannot connect to the Docker daemon" in str(card.render())
            del services.fail["status"]
            services.served = ["qwen3.5-35b-a3b"]
            await until(pilot, lambda: card.report is not None and card.report.serving, what="recovered")

    asyncio.run(scenario())


def test_a_chart_says_its_scale_and_peak() -> None:
    from textual.app import App, ComposeResult

    class One(App[None]):
        def compose(self) -> ComposeResult:
            yield Chart("power", id="c")

    async def scenario() -> str:
        app = One()
        async with app.run_test(size=(60, 8)) as pilot:
            chart = app.query_one("#c", Chart)
            chart.styles.height = 6
            chart.set_data([100.0, 250.0, 180.0, None, 120.0], "120 W")
            await pilot.pause()
            return "\n".join("".join(seg.text for seg in line) for line in chart.render_lines(chart.region.reset_offset))

    drawn = asyncio.run(scenario())
    lines = drawn.splitlines()
    assert "120 W" in lines[0]
    assert "top 275 · peak 250" in lines[1], drawn  # 250 × 1.1: the auto scale's headroom, said


def test_every_served_engine_and_the_gateways_are_shown_their_text_escaped(services: FakeServices) -> None:
    """Two engines side by side (each its engine, model, port and numbers) and the gateways: one serving with what it
    routes, loads and counts, one gone (no number); a name from a gateway's /metrics is shown as text, never markup."""
    from dataclasses import replace

    from metralectl.tui.widgets.served_engines import ServedEngines
    from tests.unit.tui.fakes import several_view

    services.served = ["qwen3.5-35b-a3b", "gemma-4-e4b"]
    view_ = several_view(0)
    named = replace(view_.gateways[0].models[0], name="[bold]x\x1b[2J", requests=0, loads=0)
    hostile = replace(view_.gateways[0], models=(*view_.gateways[0].models, named))
    services.views = [replace(view_, gateways=(hostile, view_.gateways[1]))]

    def shown(widget: ServedEngines) -> str:
        from tests.unit.tui.test_tui_snapshots import screen_text

        return screen_text(widget.app)  # the screen as painted

    async def scenario() -> None:
        app = MetralectlApp(services, status_every_s=0.2)
        async with app.run_test(size=(240, 50)) as pilot:  # wide: each gateway's words on one line
            widget = app.query_one(ServedEngines)
            await until(pilot, lambda: widget.display and "8091" in shown(widget), what="engines and gateways")
            text = shown(widget)
            for words in ("qwen3.5-35b-a3b", "gemma-4-e4b-q8", "llama-cpp", "8888", "8890", "64.5",
                          "gateway http://127.0.0.1:8090 (pid 4242) serving", "loading qwen3-8b", "queue 3",
                          "evictions 1", "requests 19", "errors 1", "gateway http://127.0.0.1:8091 (pid 4343) gone"):
                assert words in text, (words, text)
            assert "[bold]x\\x1b[2J" in text and "\x1b" not in text  # escaped, and not read as markup
            [gone] = [x for x in text.splitlines() if "8091" in x]
            assert "requests" not in gone and "serving" not in gone, gone

    asyncio.run(scenario())
