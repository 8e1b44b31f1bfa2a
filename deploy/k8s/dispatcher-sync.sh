#!/bin/sh
# Keeps Kamailio's dispatcher list equal to the ready media workers.
#
# The workers run on their nodes' network, so the headless Service's DNS name ($WORKER_SERVICE) resolves to the
# node address of every ready worker. This writes one line per address, "<set> sip:<address>:<port>", to
# $DS_LIST_FILE, and when the set changes asks Kamailio to re-read it (kamcmd dispatcher.reload over the ctl
# socket). A worker that is draining or gone leaves the DNS answer, so new calls stop going to it; calls in
# progress follow their Record-Route and are not affected.
#
#   dispatcher-sync.sh once    wait until at least one worker resolves, write the list, exit (init container)
#   dispatcher-sync.sh watch   keep the list in step every $SYNC_INTERVAL_S seconds (sidecar)
#
# An empty answer (no worker ready, or DNS failing) leaves the list as it was: Kamailio's OPTIONS probes mark
# workers that are really gone inactive by themselves.
set -u

SERVICE="${WORKER_SERVICE:?set WORKER_SERVICE to the headless Service of the workers}"
PORT="${WORKER_SIP_PORT:?set WORKER_SIP_PORT to the SIP port of the workers}"
SET="${DS_SET:-1}"
LIST="${DS_LIST_FILE:-/run/kamailio/dispatcher.list}"
CTL="${CTL_SOCKET:-unix:/run/kamailio/kamailio_ctl}"
INTERVAL="${SYNC_INTERVAL_S:-10}"

render() {
	getent ahostsv4 "$SERVICE" | awk -v set="$SET" -v port="$PORT" '{ print set " sip:" $1 ":" port }' | sort -u
}

write_if_changed() {
	new="$(render)"
	if [ -z "$new" ]; then
		return 1
	fi
	if [ -f "$LIST" ] && [ "$new" = "$(cat "$LIST")" ]; then
		return 1
	fi
	printf '%s\n' "$new" > "$LIST.tmp" && mv "$LIST.tmp" "$LIST"
	echo "dispatcher-sync: $(printf '%s\n' "$new" | wc -l) worker(s): $(printf '%s' "$new" | tr '\n' ' ')"
	return 0
}

# kamcmd exits 0 even when the RPC fails (Kamailio refuses a reload within 5 s of the last one, ds_reload_delta,
# with "error: 500 - Ongoing reload"): what it prints tells.
reload() {
	out="$(kamcmd -s "$CTL" dispatcher.reload 2>&1)"
	status=$?
	echo "dispatcher-sync: kamcmd dispatcher.reload: $out"
	[ "$status" -eq 0 ] && [ "${out#error}" = "$out" ]
}

case "${1:-watch}" in
once)
	until [ -s "$LIST" ] || write_if_changed; do
		echo "dispatcher-sync: no worker behind $SERVICE yet"
		sleep 2
	done
	;;
watch)
	# A list written but not yet loaded (Kamailio restarting, the ctl socket not there yet) is retried.
	pending=0
	while :; do
		if write_if_changed; then
			pending=1
		fi
		if [ "$pending" = 1 ]; then
			if reload; then
				pending=0
			else
				echo "dispatcher-sync: the reload failed; trying again" >&2
			fi
		fi
		sleep "$INTERVAL"
	done
	;;
*)
	echo "usage: $0 once|watch" >&2
	exit 2
	;;
esac
