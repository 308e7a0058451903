// pch_std.h - the standard headers most translation units include, precompiled once per flag set (issue 32).
// No project or third-party header: a precompiled header must not depend on a target's own macros, and those that
// need json, CLI11 or rapidcheck parse them themselves. No <iostream> (its static initializer would reach every file).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>
