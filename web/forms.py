"""Input from the pages, checked at the edge; the services check the rest and say why."""

from django import forms

from tenants.scopes import ALL_SCOPES, INFERENCE


class AdapterCreateForm(forms.Form):
    name = forms.CharField(
        max_length=63,
        strip=False,
        help_text="lowercase letters, digits, '-' and '_'; used in model names",
        widget=forms.TextInput(attrs={"placeholder": "e.g. ticket-replies", "autocomplete": "off"}),
    )
    description = forms.CharField(
        max_length=2000, required=False, widget=forms.TextInput(attrs={"placeholder": "optional"})
    )


class AliasSetForm(forms.Form):
    version = forms.IntegerField(min_value=1)
    weight = forms.IntegerField(min_value=0, max_value=100, required=False)


class ApiKeyCreateForm(forms.Form):
    name = forms.CharField(
        max_length=100, widget=forms.TextInput(attrs={"placeholder": "ci", "autocomplete": "off"})
    )
    scopes = forms.MultipleChoiceField(
        choices=[(s, s) for s in ALL_SCOPES],
        initial=[INFERENCE],
        widget=forms.CheckboxSelectMultiple,
    )
    expires_in_days = forms.IntegerField(
        min_value=1, max_value=3650, required=False, help_text="empty: never expires"
    )


class UsagePeriodForm(forms.Form):
    PERIODS = (7, 30, 90)
    DEFAULT = 30

    days = forms.TypedChoiceField(choices=[(d, f"{d} days") for d in PERIODS], coerce=int)
