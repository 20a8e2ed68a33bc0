// Text from outside made safe to show: the page's twin of metralectl/safetext.py's clean(). The page
// writes text with textContent only (never as HTML), but control and format characters would still
// let a peer's name or a record's field hide or reorder what is shown (a bidi override, a zero-width
// joiner); they are shown as escapes (\x1b, \n, \u202e) instead, and the text is capped.
"use strict";

const SAFETEXT_NAMED = { "\n": "\\n", "\r": "\\r", "\t": "\\t" };
const SAFETEXT_UNSAFE = /^[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Cs}\p{Co}\p{Cn}]$/u;

function hexPad(code, width) { return code.toString(16).padStart(width, "0"); }

function clean(text, limit) {
  const out = [];
  for (const ch of String(text ?? "")) {  // by code point, as Python counts
    const code = ch.codePointAt(0);
    if (SAFETEXT_NAMED[ch]) out.push(SAFETEXT_NAMED[ch]);
    else if (SAFETEXT_UNSAFE.test(ch)) {
      out.push(code < 0x100 ? `\\x${hexPad(code, 2)}` : code < 0x10000 ? `\\u${hexPad(code, 4)}` : `\\U${hexPad(code, 8)}`);
    } else out.push(ch);
  }
  const chars = Array.from(out.join(""));
  if (limit === undefined || limit === null || chars.length <= limit) return chars.join("");
  return chars.slice(0, Math.max(limit - 1, 0)).join("") + "…";
}

if (typeof module !== "undefined") module.exports = { clean };  // for the tests (node); the page has no module
