"""The tuning farm's core: the stack tuner controller, its policy, identity, stores and runtimes.

``import farm`` never imports Celery, Redis or CuPy.
"""

from farm import replay
from farm.adapter import RuntimeTrials, enable_stack_autotune, stack_autotuner, try_execute_stack
from farm.arrays import array_signature, compare_outputs
from farm.decisions import Decision, DecisionSource, NearestDecision, Stats, TuneReport, is_tuning
from farm.engine import StackTuner
from farm.environment import RuntimeEnvironment, runtime_environment
from farm.errors import ConfigError, FailureKind, FarmError, TuneFailure
from farm.feedback import FleetReporter
from farm.identity import CacheKey, Candidate, Problem, Scope, cache_key, fields
from farm.oneshot import Tuned, tune
from farm.policy import MemoryEviction, Mode, StackPolicy, Timing, Tolerance
from farm.runner import TrialRunner, Validation
from farm.runtimes import ComputeClient, HostClient, client_for
from farm.scoring import paired_score
from farm.space import Space
from farm.trials import CandidateReport, TrialVerdict
from farm.tunable import Implementation, TunableSet

__all__ = [
    "CacheKey", "Candidate", "CandidateReport", "ComputeClient", "ConfigError", "Decision", "DecisionSource",
    "FailureKind", "FarmError", "HostClient", "Implementation", "MemoryEviction", "Mode", "NearestDecision",
    "Problem", "RuntimeEnvironment", "RuntimeTrials", "Scope", "Space", "StackPolicy", "StackTuner", "Stats",
    "Timing", "Tolerance", "TrialRunner", "TrialVerdict", "TunableSet", "TuneFailure", "TuneReport", "Tuned",
    "Validation", "array_signature", "cache_key", "client_for", "compare_outputs", "enable_stack_autotune",
    "FleetReporter", "fields", "is_tuning", "paired_score", "replay", "runtime_environment",
    "stack_autotuner", "try_execute_stack", "tune",
]
