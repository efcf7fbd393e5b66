"""The named codec levels, as data (the quality-evaluation work tunes these numbers).

high / balanced / compact: one uniform step per layer ("layer" scale: the per-layer uniform
quantizer the quality notes measured best per bit), the first token kept exact (the attention
sink: 1 exact token measured as good as 4 at fewer bits; 0 quadruples KLD), and bins per layer
group from a sensitivity calibration on the default model (KLD with one layer of one kind
quantized at a time, two bin counts each; Lagrangian allocation over (kind, layer) with at
least 12 key bins and 6 value bins, split into <= 16 runs of layers; commands and numbers in
benchmarks/RESULTS.md "Level tuning", made with benchmarks/level_tuning.py). Sized for at most
2.1 / 1.5 / 1.0 bits per element on the default model's KV for both evaluation texts; layer
edges are fractions of depth, so on other models the same bins fall on other layers.
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
        "sink_tokens": 1,
        "anchor_group": 0,
        "keys": {"scale": "layer",
                 "bins": [30, 36, 28, 38, 26, 34, 24, 40, 60, 34, 44, 36, 52, 20, 34, 24],
                 "layer_edges": [0.233333, 0.3, 0.333333, 0.366667, 0.466667, 0.533333, 0.566667,
                                 0.6, 0.633333, 0.666667, 0.7, 0.766667, 0.833333, 0.866667, 0.9]},
        "values": {"scale": "layer",
                 "bins": [24, 16, 22, 18, 22, 18, 12, 14, 10, 12, 18, 10, 14, 12, 18, 8],
                 "layer_edges": [0.033333, 0.1, 0.166667, 0.266667, 0.3, 0.366667, 0.5, 0.533333,
                                 0.566667, 0.6, 0.633333, 0.666667, 0.7, 0.766667, 0.833333]},
    },
    "balanced": {
        "mode": "quantized",
        "lanes": 32,
        "states": 4,
        "sink_tokens": 1,
        "anchor_group": 0,
        "keys": {"scale": "layer",
                 "bins": [12, 30, 12, 28, 36, 12, 22, 32, 22, 38, 56, 36, 48, 18, 32, 22],
                 "layer_edges": [0.033333, 0.066667, 0.233333, 0.333333, 0.366667, 0.4, 0.466667,
                                 0.533333, 0.566667, 0.6, 0.633333, 0.766667, 0.833333, 0.866667,
                                 0.9]},
        "values": {"scale": "layer",
                 "bins": [16, 8, 6, 8, 6, 12, 6, 10, 16, 6, 14, 10, 6, 16, 6, 8],
                 "layer_edges": [0.033333, 0.1, 0.166667, 0.3, 0.5, 0.533333, 0.566667, 0.6,
                                 0.633333, 0.666667, 0.7, 0.733333, 0.766667, 0.833333, 0.933333]},
    },
    "compact": {
        "mode": "quantized",
        "lanes": 32,
        "states": 4,
        "sink_tokens": 1,
        "anchor_group": 0,
        "keys": {"scale": "layer",
                 "bins": [12, 16, 12, 22, 12, 16, 12, 20, 34, 18, 22, 20, 26, 12, 18, 12],
                 "layer_edges": [0.233333, 0.266667, 0.333333, 0.366667, 0.466667, 0.533333,
                                 0.566667, 0.6, 0.633333, 0.666667, 0.7, 0.766667, 0.833333,
                                 0.866667, 0.9]},
        "values": {"scale": "layer",
                 "bins": [10, 6, 6, 8, 6, 10, 6],
                 "layer_edges": [0.033333, 0.066667, 0.6, 0.633333, 0.766667, 0.833333]},
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
