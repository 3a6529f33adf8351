"""examples/movielens/labels.py and the MovieLens user_label tasks: the MovieLens-1M age bands, one
labels row per user with the genres of their test target, and task specs that load."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pyarrow as pa

from lumos.eval.tasks import load_tasks

MOVIELENS = Path(__file__).resolve().parents[2] / "examples" / "movielens"
spec = importlib.util.spec_from_file_location("movielens_labels", MOVIELENS / "labels.py")
labels = importlib.util.module_from_spec(spec)
sys.modules["movielens_labels"] = labels
spec.loader.exec_module(labels)


def test_age_bands_are_movielens_1m_s_seven():
    ages = [7, 17, 18, 24, 25, 34, 35, 44, 45, 49, 50, 55, 56, 73]
    assert [labels.age_band(age) for age in ages] == ["<18", "<18", "18-24", "18-24", "25-34", "25-34", "35-44",
                                                      "35-44", "45-49", "45-49", "50-55", "50-55", "56+", "56+"]


def test_one_row_per_user_with_the_genres_of_the_last_rating():
    users = pa.table({"user_id": ["1", "2", "3"], "age": [24, 53, 17], "gender": ["M", "F", "M"],
                      "occupation": ["writer", "other", "student"]})
    items = pa.table({"item_id": ["10", "20"], "genres": ["Action Comedy", "Drama"]})
    table = labels.user_labels(users, items, {"1": "20", "2": "10"}).to_pylist()
    assert table == [
        {"user_id": "1", "gender": "M", "age_band": "18-24", "occupation": "writer", "genres": "Drama"},
        {"user_id": "2", "gender": "F", "age_band": "50-55", "occupation": "other", "genres": "Action|Comedy"},
        {"user_id": "3", "gender": "M", "age_band": "<18", "occupation": "student", "genres": None},
    ]


def test_the_user_label_tasks_load():
    tasks = load_tasks([MOVIELENS / "tasks"])
    expected = {"movielens_gender": ("gender", "classes", "auc_roc"), "movielens_age_band": ("age_band", "classes", "macro_f1"),
                "movielens_occupation": ("occupation", "classes", "macro_f1"),
                "movielens_genres": ("genres", "label_sets", "macro_auc_roc")}
    for name, (label, target, primary) in expected.items():
        task = tasks[name].spec
        assert (task.kind, task.split, task.labels.label, task.labels.target, task.primary_metric) == \
            ("user_label", "test", label, target, primary)
        assert task.labels.folds == 5 and (tasks[name].path.parent / task.labels.path).name == "labels.parquet"
