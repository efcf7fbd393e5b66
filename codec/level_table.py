"""The named codec levels, as data (the quality-evaluation work tunes these numbers).

Each entry is a CodecConfig in its JSON form minus "id" and "name". A Python dict rather than a
JSON file so it ships in every wheel without package-data rules. This module must never hold
code: `levels.py` validates and interprets it.
"""

LEVELS = {
    "lossless": {"mode": "lossless", "lanes": 16},
    "high": {
        "mode": "quantized",
        "lanes": 16,
        "sink_tokens": 4,
        "anchor_group": 0,
        "keys": {"scale": "channel", "bins": [48, 40, 32], "layer_edges": [0.3333, 0.6667]},
        "values": {"scale": "token", "bins": [32, 24, 24], "layer_edges": [0.3333, 0.6667]},
    },
    "balanced": {
        "mode": "quantized",
        "lanes": 16,
        "sink_tokens": 4,
        "anchor_group": 0,
        "keys": {"scale": "channel", "bins": [32, 24, 20], "layer_edges": [0.3333, 0.6667]},
        "values": {"scale": "token", "bins": [20, 16, 16], "layer_edges": [0.3333, 0.6667]},
    },
    "compact": {
        "mode": "quantized",
        "lanes": 16,
        "sink_tokens": 4,
        "anchor_group": 0,
        "keys": {"scale": "channel", "bins": [20, 16, 12], "layer_edges": [0.3333, 0.6667]},
        "values": {"scale": "token", "bins": [12, 10, 10], "layer_edges": [0.3333, 0.6667]},
    },
    "cachegen-1": {
        "mode": "quantized",
        "lanes": 16,
        "sink_tokens": 0,
        "anchor_group": 0,
        "keys": {"scale": "token", "bins": [16, 16, 12], "layer_edges": [0.3125, 0.625]},
        "values": {"scale": "token", "bins": [16, 12], "layer_edges": [0.0625]},
    },
    "cachegen-2": {
        "mode": "quantized",
        "lanes": 16,
        "sink_tokens": 0,
        "anchor_group": 0,
        "keys": {"scale": "token", "bins": [32, 16, 16], "layer_edges": [0.3125, 0.625]},
        "values": {"scale": "token", "bins": [32, 16], "layer_edges": [0.0625]},
    },
    "cachegen-3": {
        "mode": "quantized",
        "lanes": 16,
        "sink_tokens": 0,
        "anchor_group": 0,
        "keys": {"scale": "token", "bins": [32, 32, 32], "layer_edges": [0.3125, 0.625]},
        "values": {"scale": "token", "bins": [32, 32], "layer_edges": [0.0625]},
    },
}
