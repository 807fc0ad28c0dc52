# Shared by tests/cluster/build.sh and tests/tools/build.sh (sourced, not run): a cache of
# built binaries under ${GPUFABRIC_CACHE:-$HOME/.cache/gpufabric}/<kind>/<key>/bin, trusted
# only once its stamp file is written, with concurrent builds of one key serialised.
#
# The caller sets `cache_tag` (the log prefix) and `binaries` (the names the cache must
# hold), then calls cache_parse_args, computes its key, and calls cache_open.

log() { echo "[$cache_tag] $*" >&2; }
die() {
	echo "[$cache_tag] ERROR: $*" >&2
	exit 1
}

# cache_parse_args <usage function> "$@": sets print_only for --print-bin-dir, runs the
# usage function for --help, refuses anything else.
cache_parse_args() {
	local usage="$1" arg
	shift
	print_only=0
	for arg in "$@"; do
		case "$arg" in
		--print-bin-dir) print_only=1 ;;
		-h | --help)
			"$usage"
			exit 0
			;;
		*)
			echo "$cache_tag/build.sh: unknown argument: $arg (try --help)" >&2
			exit 2
			;;
		esac
	done
}

# Whether every binary is in the cache and the stamp says the build finished.
cache_is_warm() {
	[[ -f "$stamp" ]] || return 1
	local b
	for b in "${binaries[@]}"; do
		[[ -x "$bin_dir/$b" ]] || return 1
	done
}

# cache_open <kind> <key>: sets key_dir, bin_dir and stamp. Prints the bin directory and
# exits when only asked for it or when the cache is warm; otherwise takes the key's lock
# (waiting for a build of the same key to finish, then exiting if it left the cache warm)
# and returns with the stamp removed, for the caller to build.
cache_open() {
	local kind="$1" key="$2"
	local cache_root="${GPUFABRIC_CACHE:-$HOME/.cache/gpufabric}"
	key_dir="$cache_root/$kind/$key"
	bin_dir="$key_dir/bin"
	stamp="$key_dir/complete"
	if ((print_only)) || cache_is_warm; then
		echo "$bin_dir"
		exit 0
	fi
	mkdir -p "$bin_dir"
	if command -v flock >/dev/null 2>&1; then
		exec 9>"$key_dir/.lock"
		if ! flock -n 9; then
			log "another build of $key is running; waiting for it..."
			flock 9
		fi
		if cache_is_warm; then
			echo "$bin_dir"
			exit 0
		fi
	fi
	rm -f "$stamp"
}

# cache_close <started at, in SECONDS>: writes the stamp from the KEY=VALUE lines on stdin
# plus the build time (last, so that a half-finished build is never trusted) and prints
# the bin directory.
cache_close() {
	local start="$1"
	{
		cat
		echo "BUILD_SECONDS=$((SECONDS - start))"
		echo "BUILT_AT=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	} >"$stamp.tmp"
	mv -f "$stamp.tmp" "$stamp"
	log "done in $((SECONDS - start))s: $bin_dir"
	echo "$bin_dir"
}
