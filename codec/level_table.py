"""The named codec levels, as data (the quality-evaluation work tunes these numbers).

high / balanced / compact: one uniform step per layer ("layer" scale: the per-layer uniform
quantizer the quality notes measured best per bit, and the lowest MSE per bit measured here)
and the first 4 tokens kept exact (attention sinks, which halved KLD in a probe). Keys get
most of the bits: at equal size, giving keys 2-3x the bins of values cut KLD ~3x, and
CacheGen's "more bins for early layers" made it worse on this model. Bins chosen for at most
2.1 / 1.5 / 1.0 bits per element on the default model's KV (benchmarks/RESULTS.md).
cachegen-1/2/3: CacheGen's published per-token bins, for comparison with the paper.

Each entry is a CodecConfig in its JSON form minus "id" and "name". A Python dict rather than a
JSON file so it ships in every wheel without package-data rules. This module must never hold
code: `levels.py` validates and interprets it.
"""

LEVELS = {
    "lossless": {"mode": "lossless", "lanes": 32, "states": 4},
    "high": {
        "mode": "quantized",
        "lanes": 32,
        "states": 4,
        "sink_tokens": 4,
        "anchor_group": 0,
        "keys": {"scale": "layer", "bins": [36, 36, 36], "layer_edges": [0.3333, 0.6667]},
        "values": {"scale": "layer", "bins": [14, 12, 12], "layer_edges": [0.3333, 0.6667]},
    },
    "balanced": {
        "mode": "quantized",
        "lanes": 32,
        "states": 4,
        "sink_tokens": 4,
        "anchor_group": 0,
        "keys": {"scale": "layer", "bins": [20, 22, 24], "layer_edges": [0.3333, 0.6667]},
        "values": {"scale": "layer", "bins": [10, 8, 8], "layer_edges": [0.3333, 0.6667]},
    },
    "compact": {
        "mode": "quantized",
        "lanes": 32,
        "states": 4,
        "sink_tokens": 4,
        "anchor_group": 0,
        "keys": {"scale": "layer", "bins": [14, 16, 18], "layer_edges": [0.3333, 0.6667]},
        "values": {"scale": "layer", "bins": [6, 6, 6], "layer_edges": [0.3333, 0.6667]},
    },
    "cachegen-1": {
        "mode": "quantized",
        "lanes": 32,
        "states": 4,
        "sink_tokens": 0,
        "anchor_group": 0,
        "keys": {"scale": "token", "bins": [16, 16, 12], "layer_edges": [0.3125, 0.625]},
        "values": {"scale": "token", "bins": [16, 12], "layer_edges": [0.0625]},
    },
    "cachegen-2": {
        "mode": "quantized",
        "lanes": 32,
        "states": 4,
        "sink_tokens": 0,
        "anchor_group": 0,
        "keys": {"scale": "token", "bins": [32, 16, 16], "layer_edges": [0.3125, 0.625]},
        "values": {"scale": "token", "bins": [32, 16], "layer_edges": [0.0625]},
    },
    "cachegen-3": {
        "mode": "quantized",
        "lanes": 32,
        "states": 4,
        "sink_tokens": 0,
        "anchor_group": 0,
        "keys": {"scale": "token", "bins": [32, 32, 32], "layer_edges": [0.3125, 0.625]},
        "values": {"scale": "token", "bins": [32, 32], "layer_edges": [0.0625]},
    },
}
