"""Tool calling for models whose chat template has no tool syntax (SmolLM2, Gemma 3 270M):
what an agent client offers (`offer`: the tools, the choice among them), told to the model in
a system prompt section, the call held to a grammar, and the conversation's tool calls and
tool results written into the model's turns as text (`turns`), the answer read back into
calls. It is the Python API the local API's routes stand on (OpenAI's chat completions,
Ollama's /api/chat), in neither's shapes.

It never evaluates anything, never runs a tool (the client does) and never imports the
server, the engine or the store: it turns messages into messages and text into calls.
"""

from .offer import CLOSE, MARKER, Offer, Tool, offer_of
from .turns import RESULT, Answer, Call, Repeats, Watch, new_call_id, read, written

__all__ = ["CLOSE", "MARKER", "RESULT", "Answer", "Call", "Offer", "Repeats", "Tool", "Watch",
           "new_call_id", "offer_of", "read", "written"]
