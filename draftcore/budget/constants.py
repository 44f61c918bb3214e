"""The auto budget's fixed numbers, in one place, each with the measurement it comes from (the
sections of docs/budget.md named here hold the runs). Its tunable settings are CostAwareBudget's
options; these are not options.
"""
# costs.py -- "Costs"
OUTLIER = 2.0           # a step counts as at most this times its size's estimate (a tree's first, its guess):
                        # one 40 ms llama.cpp stall raised a root-only step from 5.5 to 12.4 ms; a stalled
                        # first tree locked drafting out in 2 runs of 7 on a loaded machine, 0 of 4 with it
# contexts.py -- "Costs by context length"
SMALLEST_BUCKET = 8     # bit length: contexts under 256 tokens share one cost table (costs barely differ there)
# calibration.py -- "Calibration"
BINS = 20               # score bins
RANKS = 6               # rank buckets 1, 2-3, 4-7, 8-15, 16-31, 32+: without them the ablation loses up to 5 %
CALIBRATION_PRIOR = 2.0  # candidates a cell starts with, accepted at its bin's centre (a weak prior)
# corrections.py -- "Corrections": (memory, prior tokens, floor) of each; without both, up to -8 % (llama.cpp edit)
CORRECTION_MEMORY = 32
BIAS_PRIOR, BIAS_FLOOR = 4.0, 0.25
GAMBLE_PRIOR, GAMBLE_FLOOR = 12.0, 0.6
# explore.py, pausing.py, lookahead.py -- "Exploring", "Pausing", "Lookahead windows"
HOPELESS = 0.5          # a size worth less than this share of another is not worth a step to check
MAX_BACKOFF = 16        # explorations and pause trials grow at most this many times apart
ARM_MEMORY = 256        # an arm's steps after which its evidence has faded to 1/e
PAUSE_TRIAL = 4         # steps a trial of pausing lasts: a paused step always costs the same and emits one token
PAUSE_MARGIN = 0.05     # pausing must beat drafting by this much, in two trials running: a burst missed while
                        # paused costs more than a few percent of drafting overhead, and step times are noisy
SETTLED_TRIALS = 2      # drafting steps, in `every`s, before a trial pausing won is confirmed soon
# idle.py -- "Skipping a drafter with nothing to offer"
ROOT_SMOOTHING = 0.02   # weight of a root-only step in its average: the difference sought is a few percent
# aftermath.py -- "Aftermath"
AFTERMATH_FLOOR = 0.5   # a drafted step's cost with its aftermath is at least this share of its own seconds
# floor.py -- "The floor per request"
FIRST_SLACK = 1.0       # root-only steps of slack a request starts with: without it, replayed first requests
                        # on HF CPU's costs, HumanEval, 1.31x against 1.38x
CARRIED_SLACK = 4.0     # most slack carried over from the requests before: without it, one budget carried over
                        # every dataset loses up to 10 % (llamacpp-cpu edit, the ablation)
