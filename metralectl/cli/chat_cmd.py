"""`chat [RECIPE] [PROMPT]`: does the served model answer? One streamed answer, or a small REPL.

The answer goes to stdout as it streams (text, with control characters shown as escapes: an engine's
text cannot drive the terminal); its reasoning, notes and errors to stderr. httpx and docker are imported
inside the command (app/chat.py), so `--help` stays light.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import typer

from metralectl.cli.state import note, style

if TYPE_CHECKING:
    from metralectl.app.chat import Answer, ChatClient, ChatOptions

REPL_HELP = "/exit (or Ctrl-D) ends; /clear forgets the conversation; Ctrl-C stops an answer"


def chat(
    words: list[str] = typer.Argument(None, metavar="[RECIPE] [PROMPT]",
                                      help="The served recipe to ask (default: the one served) and the prompt "
                                           "(none on a terminal: a conversation; none on a pipe: read stdin)."),
    url: str = typer.Option(None, "--url", help="Ask this endpoint (http://HOST:PORT) instead of what metralectl serves."),
    system: str = typer.Option(None, "--system", help="A system message before the conversation."),
    max_tokens: int = typer.Option(None, "--max-tokens", min=1, help="Stop the answer after this many tokens."),
    temperature: float = typer.Option(None, "--temperature", min=0.0, help="Sampling temperature (engine default)."),
    as_json: bool = typer.Option(False, "--json", help="One prompt: print the final message and usage as JSON."),
) -> None:
    """Ask the served model: one streamed answer to PROMPT, or a conversation on a terminal.

    RECIPE: the served recipe to ask (default: the one metralectl serves). PROMPT: the question; without
    one, a conversation on a terminal (/exit or Ctrl-D ends it, Ctrl-C stops an answer), or the prompt
    read from stdin on a pipe. The answer streams to stdout; exit 0 only when it completed.
    """
    from metralectl.app.chat import ChatClient, ChatOptions, resolve
    from metralectl.errors import UsageError

    recipe, prompt = _split_words(list(words or []), url)
    if prompt is None and not sys.stdin.isatty():
        prompt = sys.stdin.read().strip()
        if not prompt:
            raise UsageError("no prompt: stdin was empty", "give it as an argument: `metralectl chat \"hello\"`")
    if prompt is None and as_json:
        raise UsageError("--json answers one prompt: give it", "`metralectl chat --json \"hello\"`")
    options = ChatOptions(system, max_tokens, temperature)
    target = resolve(recipe, url)
    with ChatClient(target) as client:
        client.served_model()
        if prompt is not None:
            _one_shot(client, prompt, options, as_json)
        else:
            _repl(client, options)


def _split_words(words: list[str], url: str | None) -> tuple[str | None, str | None]:
    """(RECIPE, PROMPT). With --url every word is the prompt. One word alone is the recipe when a recipe of
    that name is served, or the catalog knows it (then `resolve` says it is not served); else the prompt."""
    from metralectl.errors import UsageError

    if not words:
        return None, None
    if url:
        return None, " ".join(words)
    if len(words) >= 2:
        if len(words) > 2:
            raise UsageError(f"expected [RECIPE] [PROMPT], got {len(words)} words",
                             "quote the prompt: `metralectl chat RECIPE \"a prompt with spaces\"`")
        return words[0], words[1]
    word = words[0]
    if word.split() != [word]:
        return None, word  # spaces: a prompt, never a recipe name
    from metralectl.app.chat import is_served

    if is_served(word) or _known_recipe(word):
        return word, None
    return None, word


def _known_recipe(name: str) -> bool:
    from metralectl.core.catalog import load_catalog
    from metralectl.errors import MetralError

    try:
        return name in load_catalog().recipes
    except MetralError:
        return False


class _Printer:
    """Where the streamed pieces go: content to stdout, reasoning dimmed to stderr; one newline at the end."""

    def __init__(self) -> None:
        self.in_reasoning = False
        self.last = "\n"

    def content(self, text: str) -> None:
        from metralectl.safetext import printable

        if self.in_reasoning:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.in_reasoning = False
        sys.stdout.write(printable(text))
        sys.stdout.flush()
        self.last = text[-1:] or self.last

    def reasoning(self, text: str) -> None:
        from metralectl.safetext import printable

        self.in_reasoning = True
        sys.stderr.write(style(printable(text), "2", sys.stderr))
        sys.stderr.flush()

    def end(self) -> None:
        if self.in_reasoning:
            sys.stderr.write("\n")
            self.in_reasoning = False
        if self.last != "\n":
            sys.stdout.write("\n")
            self.last = "\n"
        sys.stdout.flush()


def _messages(options: ChatOptions) -> list[dict[str, str]]:
    return [{"role": "system", "content": options.system}] if options.system else []


def _one_shot(client: ChatClient, prompt: str, options: ChatOptions, as_json: bool) -> None:
    from metralectl.errors import ExitCode, MetralError

    messages = _messages(options) + [{"role": "user", "content": prompt}]
    printer = _Printer()
    try:
        if as_json:
            answer = client.ask(messages, options)
            print(json.dumps(_json(client, answer), indent=2))
            return
        answer = client.ask(messages, options, printer.content, printer.reasoning)
    except KeyboardInterrupt:
        # said here: Click turns a bare Ctrl-C into a silent exit 130
        raise MetralError("interrupted: the answer was stopped before it finished",
                          exit_code=ExitCode.INTERRUPTED) from None
    finally:
        printer.end()
    _say_stop(answer, options)


def _json(client: ChatClient, answer: Answer) -> dict[str, object]:
    """The final message as the engine sent it (JSON escapes it; nothing here reaches a terminal raw)."""
    message: dict[str, object] = {"role": "assistant", "content": answer.content}
    if answer.reasoning:
        message["reasoning_content"] = answer.reasoning
    return {"url": client.target.url, "recipe": client.target.recipe, "model": answer.model or client.model,
            "message": message, "finish_reason": answer.finish_reason, "usage": answer.usage}


def _say_stop(answer: Answer, options: ChatOptions) -> None:
    if answer.finish_reason == "length":
        limit = f" (--max-tokens {options.max_tokens})" if options.max_tokens else ""
        note(style(f"· the answer was cut at its token limit{limit}", "33", sys.stderr))


def _repl(client: ChatClient, options: ChatOptions) -> None:
    """A conversation: each answer streams; the history is kept for the next question."""
    from metralectl.errors import MetralError
    from metralectl.safetext import clean

    try:
        import readline  # noqa: F401  (line editing and history for input(), where the platform has it)
    except ImportError:
        pass
    who = clean(client.target.recipe or client.model or client.target.url, 120)
    note(style(f"chatting with {who} at {client.target.url}  ({REPL_HELP})", "2", sys.stderr))
    history = _messages(options)
    while True:
        try:
            line = input(">>> ")
        except EOFError:  # Ctrl-D
            sys.stderr.write("\n")
            return
        except KeyboardInterrupt:  # Ctrl-C at the prompt: a fresh prompt, as a shell does
            sys.stderr.write("^C\n")
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/bye", "/quit"):
            return
        if text == "/clear":
            history = _messages(options)
            note(style("· the conversation is forgotten", "2", sys.stderr))
            continue
        if text in ("/help", "/?"):
            note(REPL_HELP)
            continue
        history.append({"role": "user", "content": line})
        printer = _Printer()
        try:
            answer = client.ask(history, options, printer.content, printer.reasoning)
        except KeyboardInterrupt:
            printer.end()
            history.pop()  # an answer cut short is not part of the conversation
            note(style("· cancelled", "33", sys.stderr))
            continue
        except MetralError as exc:
            printer.end()
            history.pop()
            note(style(f"metralectl: {exc.message}", "31", sys.stderr))
            continue
        printer.end()
        _say_stop(answer, options)
        history.append({"role": "assistant", "content": answer.content})


def register(app: typer.Typer) -> None:
    app.command("chat")(chat)
