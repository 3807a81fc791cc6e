// The launch form: whether each spec fits now in the chosen region, and what the launch does
// to the tenant's quota, before submitting.
(() => {
  "use strict";
  const form = document.querySelector("[data-launch-form]");
  if (!form) return;
  const region = form.querySelector("[data-region]");
  const quota = form.querySelector("[data-quota]");
  const rows = form.querySelectorAll("tr[data-spec]");
  const number = (value) => Number.parseFloat(value || "0");
  const show = (value) => String(Math.round(value * 1000) / 1000);

  function selectedRow() {
    const checked = form.querySelector("input[name=spec]:checked");
    return checked ? checked.closest("tr") : null;
  }

  function updateFits() {
    rows.forEach((row) => {
      const fits = row.dataset.fits.split(" ").includes(region.value);
      row.querySelector("[data-role=fit]").innerHTML = fits
        ? '<span class="badge badge-running">fits now</span>'
        : '<span class="badge badge-pending">will queue</span>';
      row.dataset.fitsNow = fits ? "1" : "0";
    });
  }

  function meter(el, used, limit) {
    const pct = limit > 0 ? Math.min(100, (used * 100) / limit) : 100;
    el.style.width = `${pct}%`;
    el.parentElement.className = `meter${used > limit ? " bad" : pct >= 80 ? " warn" : ""}`;
  }

  function updateQuota() {
    const row = selectedRow();
    const gpuLimit = number(quota.dataset.gpuQuota);
    const instLimit = number(quota.dataset.maxInstances);
    const gpuAfter = number(quota.dataset.gpuUsed) + (row ? number(row.dataset.gpu) : 0);
    const instAfter = number(quota.dataset.instancesUsed) + (row ? 1 : 0);
    quota.querySelector("[data-role=gpu-after]").textContent = `${show(gpuAfter)} / ${show(gpuLimit)}`;
    quota.querySelector("[data-role=inst-after]").textContent = `${instAfter} / ${instLimit}`;
    meter(quota.querySelector("[data-role=gpu-meter]"), gpuAfter, gpuLimit);
    meter(quota.querySelector("[data-role=inst-meter]"), instAfter, instLimit);
    const note = quota.querySelector("[data-role=fit-note]");
    if (!row) {
      note.textContent = "Choose a spec.";
    } else if (gpuAfter > gpuLimit || instAfter > instLimit) {
      note.innerHTML = '<span class="badge badge-failed">over quota</span> This launch would be refused.';
    } else if (row.dataset.fitsNow === "1") {
      note.innerHTML = '<span class="badge badge-running">fits now</span> It starts provisioning at once.';
    } else {
      note.innerHTML = '<span class="badge badge-pending">will queue</span> It waits until a slice frees.';
    }
  }

  rows.forEach((row) => row.addEventListener("click", (event) => {
    if (event.target.tagName !== "INPUT") row.querySelector("input").click();
  }));
  form.addEventListener("change", () => {
    updateFits();
    updateQuota();
  });
  updateFits();
  updateQuota();
})();
