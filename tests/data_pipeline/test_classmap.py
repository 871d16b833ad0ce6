import numpy as np
import pytest

from dfine_deploy.data.classmap import ClassMap
from dfine_deploy.errors import DatasetError

# COCO-like ids with gaps, given unsorted on purpose
CATEGORIES = [{"id": 90, "name": "toothbrush"}, {"id": 1, "name": "person"}, {"id": 3, "name": "car"}]


def test_remap_gives_contiguous_labels_in_sorted_id_order():
    cm = ClassMap.from_categories(CATEGORIES, remap=True)
    assert cm.category_ids == (1, 3, 90)
    assert [cm.label_of(c) for c in (1, 3, 90)] == [0, 1, 2]
    assert cm.num_classes == 3
    assert cm.class_names == ["person", "car", "toothbrush"]
    np.testing.assert_array_equal(cm.category_ids_of(np.array([2, 0, 1, 5, -1])), [90, 1, 3, -1, -1])


def test_without_remap_the_category_id_is_the_label():
    cm = ClassMap.from_categories(CATEGORIES, remap=False, num_classes=91)
    assert cm.label_of(90) == 90
    assert cm.class_names[3] == "car" and cm.class_names[2] == "class_2" and len(cm.class_names) == 91
    np.testing.assert_array_equal(cm.category_ids_of(np.array([3, 2, 90])), [3, -1, 90])


def test_without_remap_num_classes_must_exceed_the_largest_id():
    with pytest.raises(DatasetError) as err:
        ClassMap.from_categories(CATEGORIES, remap=False, num_classes=90)
    text = str(err.value)
    assert "num_classes is 90" in text and "at least 91" in text and "remap_mscoco_category" in text


def test_remap_num_classes_below_the_category_count_is_refused():
    with pytest.raises(DatasetError, match="at least 3"):
        ClassMap.from_categories(CATEGORIES, remap=True, num_classes=2)


def test_unknown_category_is_named():
    cm = ClassMap.from_categories(CATEGORIES, remap=True)
    with pytest.raises(DatasetError, match="category id 2 is not among"):
        cm.label_of(2)


def test_dict_round_trip_and_table():
    cm = ClassMap.from_categories(CATEGORIES, remap=True)
    assert ClassMap.from_dict(cm.to_dict()) == cm
    lines = cm.table().splitlines()
    assert lines[0].split() == ["category_id", "label", "name"]
    assert lines[1].split() == ["1", "0", "person"] and lines[3].split() == ["90", "2", "toothbrush"]
    with pytest.raises(DatasetError, match="malformed"):
        ClassMap.from_dict({"names": []})


MODEL_NAMES = ["person", "bicycle", "car", "dog", "toothbrush"]


@pytest.mark.parametrize(
    "categories",
    [
        [{"id": 1, "name": "car"}, {"id": 2, "name": "person"}, {"id": 3, "name": "toothbrush"}],
        [{"id": 90, "name": "toothbrush"}, {"id": 0, "name": "car"}, {"id": 44, "name": "person"}],
        [{"id": 5, "name": "person"}, {"id": 6, "name": "car"}, {"id": 7, "name": "toothbrush"}],
    ],
)
def test_a_model_meets_any_numbering_of_its_classes_by_name(categories):
    match = ClassMap.for_model(categories, MODEL_NAMES)
    assert match.by_name and "3 categories matched by name" in match.line
    id_of = {c["name"]: c["id"] for c in categories}
    labels = np.array([0, 2, 4, 1, 3, 7, -1])  # person, car, toothbrush, then classes the data lacks
    expected = [id_of["person"], id_of["car"], id_of["toothbrush"], -1, -1, -1, -1]
    np.testing.assert_array_equal(match.class_map.category_ids_of(labels), expected)
    assert [match.class_map.label_of(id_of[n]) for n in ("person", "car", "toothbrush")] == [0, 2, 4]
    assert ClassMap.from_dict(match.class_map.to_dict()) == match.class_map
    assert "the model's class of the same name" in match.class_map.table()


def test_categories_a_named_model_lacks_are_refused():
    categories = [{"id": 1, "name": "car"}, {"id": 2, "name": "Person"}, {"id": 3, "name": "cat"}]
    with pytest.raises(DatasetError, match=r"2 of the 3 categories \('Person', 'cat'\) are not among"):
        ClassMap.for_model(categories, MODEL_NAMES)


def test_assumed_model_names_fall_back_to_the_count_rule_and_say_so():
    categories = [{"id": 3, "name": "x"}, {"id": 1, "name": "y"}]
    same_count = ClassMap.for_model(
        categories, ["class_0", "class_1"], names_note="the model names no classes"
    )
    assert not same_count.by_name and "sorted by id to labels 0..K-1" in same_count.line
    np.testing.assert_array_equal(same_count.class_map.category_ids_of(np.array([0, 1])), [1, 3])
    other = ClassMap.for_model(categories, [f"class_{i}" for i in range(5)], names_note="no names")
    assert "category id = label" in other.line and other.class_map.label_of(3) == 3


def test_names_in_unicode_nfd_meet_their_nfc_twins(tmp_path):
    """'café' written decomposed (e + combining accent: macOS file names, some editors) is the name
    'café': a --class-map key, a category and a model's class name meet their composed twins, and a
    map giving both forms is refused as one name given twice."""
    import unicodedata

    from dfine_deploy.data.classmap import read_renames, rename_categories

    composed, decomposed = "café", unicodedata.normalize("NFD", "café")
    assert composed != decomposed
    mapping = tmp_path / "classes.yaml"
    mapping.write_text(f"{decomposed}: cup\n", encoding="utf-8")
    categories = [{"id": 1, "name": composed}, {"id": 2, "name": "tea"}]
    renames = read_renames(mapping)
    assert rename_categories(categories, renames, "val.json", "--class-map") == [
        f"classes: val.json: --class-map reads {decomposed!r} as 'cup'"
    ]
    assert [c["name"] for c in categories] == ["cup", "tea"]
    match = ClassMap.for_model([{"id": 5, "name": decomposed}, {"id": 6, "name": "tea"}], ["tea", composed])
    assert match.by_name and match.class_map.labels == (1, 0)
    mapping.write_text(f"{composed}: cup\n{decomposed}: mug\n", encoding="utf-8")
    with pytest.raises(DatasetError, match="are one name"):
        read_renames(mapping)
