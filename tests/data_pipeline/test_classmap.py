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
