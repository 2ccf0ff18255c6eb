"""Recorded by `python -m course_lib.models.capacity` (seeded; see capacity.py)."""

RESULTS = [{'n': 4, 'd_hidden': 8, 'steps': 2000, 'kind': 'gru', 'accuracy': 0.4335},
 {'n': 4, 'd_hidden': 16, 'steps': 2000, 'kind': 'gru', 'accuracy': 0.929},
 {'n': 4, 'd_hidden': 32, 'steps': 2000, 'kind': 'gru', 'accuracy': 0.997},
 {'n': 4, 'd_hidden': 64, 'steps': 2000, 'kind': 'gru', 'accuracy': 1.0},
 {'n': 4, 'd_hidden': 128, 'steps': 2000, 'kind': 'gru', 'accuracy': 1.0},
 {'n': 8, 'd_hidden': 8, 'steps': 2000, 'kind': 'gru', 'accuracy': 0.328},
 {'n': 8, 'd_hidden': 16, 'steps': 2000, 'kind': 'gru', 'accuracy': 0.5275},
 {'n': 8, 'd_hidden': 32, 'steps': 2000, 'kind': 'gru', 'accuracy': 0.656},
 {'n': 8, 'd_hidden': 64, 'steps': 2000, 'kind': 'gru', 'accuracy': 0.7755},
 {'n': 8, 'd_hidden': 128, 'steps': 2000, 'kind': 'gru', 'accuracy': 0.8225},
 {'n': 16, 'd_hidden': 8, 'steps': 2000, 'kind': 'gru', 'accuracy': 0.256},
 {'n': 16, 'd_hidden': 16, 'steps': 2000, 'kind': 'gru', 'accuracy': 0.263},
 {'n': 16, 'd_hidden': 32, 'steps': 2000, 'kind': 'gru', 'accuracy': 0.3785},
 {'n': 16, 'd_hidden': 64, 'steps': 2000, 'kind': 'gru', 'accuracy': 0.392},
 {'n': 16, 'd_hidden': 128, 'steps': 2000, 'kind': 'gru', 'accuracy': 0.422}]

LONGER = [{'n': 8, 'd_hidden': 32, 'steps': 6000, 'kind': 'gru', 'accuracy': 0.8335},
 {'n': 16, 'd_hidden': 32, 'steps': 6000, 'kind': 'gru', 'accuracy': 0.566}]
