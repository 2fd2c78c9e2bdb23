"""Fake model servers: the one part of a provider stack agenthost fakes (there is no network).

Each speaks a real wire API on 127.0.0.1 — the OpenAI Responses API (`responses`), Chat
Completions (`chat`), Anthropic Messages (`messages`), with the HTTP plumbing they share in
`http` — streaming, tool calls, and a 401 without the right credential.
`make demo PROVIDER=codex` and the test suite use the same servers, so this is an installed
package of its own: the daemon never imports it, and it imports nothing of ours.
"""
